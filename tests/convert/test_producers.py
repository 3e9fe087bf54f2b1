"""Checkpoints written by the real producers (tests/fixtures/producers: NVIDIA ModelOpt and llm-compressor /
compressed-tensors quantising tiny random-weight Qwen3-MoE, Mixtral and DeepSeek-V3 models on a CPU; the
script that made them and the producer versions are beside them), end to end through the real CLI in
subprocesses: recognised as the format their producer writes, with the family and the verdict `inspect` shows,
refused by the converter's gate exactly where that verdict says (core/targets/served.py: no entry, the engine's own
refusal, or a config the engine cannot build: core/targets/engine_config.py), converted for both targets, validated against
the source (which names the same reasons), and reversed byte for byte. CI reads the committed outputs; it never installs the producers.

No substitutions: the files are the producers' own output. A fixture whose shape the engine pads at every
split (MXFP4 at hidden 128) is converted for TP 1 (`--tp 1`, written padded as the engine pads it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_convert.core.sources.families import family_of
from dsv4_convert.core.targets.engine_config import missing_engine_keys
from tests.helpers.cli import restored_tree, run_cli, tree_hashes

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "producers"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and (p / "config.json").exists())
NO_FLAG = {k: v for k, v in os.environ.items() if k != "DSV4_CONVERT_ALLOW_UNSERVABLE"}


def _format(name: str) -> str:
    """What each producer's scheme is on disk (docs/spec/CHECKPOINT_FORMATS.md §4, §5)."""
    producer, quant = name.split("-", 1)[0], "mxfp4" if "mxfp4" in name else "nvfp4"
    assert producer in ("modelopt", "llmc"), name
    return f"{quant}-modelopt-hf" if producer == "modelopt" else f"{quant}-ct"


def _cli(*args, flag: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4_convert.cli", *map(str, args)], capture_output=True, text=True,
                          env=os.environ if flag else NO_FLAG)


def test_the_fixtures_and_their_record_are_there():
    versions = json.loads((FIXTURES / "versions.json").read_text())
    assert CASES and {c.split("-", 1)[0] for c in CASES} <= set(versions)
    assert (FIXTURES / "make_fixtures.py").is_file()


@pytest.mark.parametrize("name", CASES)
def test_producer_output_end_to_end(tmp_path, name):
    src = FIXTURES / name
    doc = json.loads(run_cli("inspect", src, "--json").stdout)
    assert doc["format"] == _format(name), doc["reason"]
    assert doc["projections"]["total"] > 0 and set(doc["projections"]["by_quant"]) == {_format(name)[:5]}
    config = json.loads((src / "config.json").read_text())
    assert doc["family"] == family_of(config).name, doc["family"]
    command = f"{_format(name)[:5]}-to-marlin"
    for i, target in enumerate(("sglang", "vllm")):
        out = tmp_path / f"out-{target}"
        served = any(why is None for key, why in doc["served"].items() if key.split(" ")[0] == target)
        proc = _cli(command, src, out, "--target", target, "--json", flag=False)
        if not served:  # the gate refuses it before writing, as validate would report it
            assert proc.returncode == 4 and json.loads(proc.stdout)["error"]["id"] == "convert.unservable_family", \
                proc.stdout
            assert not out.exists()
            proc = _cli(command, src, out, "--target", target, "--json", flag=True)
        if proc.returncode == 4 and json.loads(proc.stdout)["error"]["id"] == "convert.needs_padding":
            proc = _cli(command, src, out, "--target", target, "--tp", 1, "--json", flag=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = run_cli("validate", out, "--against", src, "--json", check=False)
        errors = {f["check"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
        unbuildable = {"source.engine_config"} if missing_engine_keys(config) else set()
        assert errors == (set() if served else {"marlin.serving_methods"}) | unbuildable, proc.stdout[-3000:]
        if i == len(name) % 2:  # one target's output is reversed, alternating between fixtures
            back = tmp_path / "back"
            run_cli("marlin-to-source", out, back, "-q")
            assert restored_tree(back) == tree_hashes(src)


@pytest.mark.parametrize("name", ["llmc-qwen3-moe-mxfp4a16", "llmc-mixtral-mxfp4a16"])
def test_vllm_serves_compressed_tensors_mxfp4_unpadded(tmp_path, name):
    """vLLM builds its compressed-tensors MXFP4 MoE method for llm-compressor's MXFP4A16, which never pads
    (core/targets/engines.py _VLLM_CT_PAD): at H = 128, where Mxfp4MoEMethod would pad H to 256, `plan` finds TP 1
    unpadded and the converter writes the layout-agnostic output without --tp (SGLang, which pads MXFP4, cannot)."""
    src = FIXTURES / name
    plan = json.loads(run_cli("plan", src, "--gpus", 1, "--gpu-mem-gib", 96, "--target", "vllm", "--json").stdout)
    assert plan["candidates"][0]["tiles"] == "ok" and plan["command"], plan["candidates"]
    run_cli("mxfp4-to-marlin", src, tmp_path / "out", "--target", "vllm", "-q")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qc.get("tp_layout") is None and {"tp": 1, "ep": 1} in qc["layouts"], qc.get("layouts")
    refused = _cli("plan", src, "--gpus", 1, "--gpu-mem-gib", 96, "--target", "sglang", "--json", flag=False)
    assert refused.returncode != 0 and json.loads(refused.stdout)["command"] is None
