"""Checkpoints written by the real producers (tests/fixtures/producers: NVIDIA ModelOpt and llm-compressor /
compressed-tensors quantising tiny random-weight Qwen3-MoE, Mixtral and DeepSeek-V3 models on a CPU; the
script that made them and the producer versions are beside them), end to end through the real CLI command lines:
recognised as the format their producer writes, with the family and the verdict `inspect` shows,
refused by the converter's gate exactly where that verdict says (core/targets/served.py: no entry, the engine's own
refusal, or a config the engine cannot build: core/targets/engine_config.py), converted for both targets, validated against
the source (which names the same reasons), and reversed byte for byte. CI reads the committed outputs; it never installs the producers.

Substitution: the command lines run in one CLI process per step (run_cli_batch: `main(argv)` each, as the console
script runs it, its exit code, stdout and stderr) instead of one process each: a process start costs more than
the work on these tiny models. Each step's batch has one environment: the gate as a user meets it
(DSV4_CONVERT_ALLOW_UNSERVABLE removed), the later steps with it set; a step that follows a refusal is chosen from
the refusal's answer, as a user would choose it. The files are the producers' own output. A fixture whose shape
the engine pads at every split (MXFP4 at hidden 128) is converted for TP 1 (`--tp 1`, written padded as the engine pads it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4_convert.core.sources.families import family_of
from dsv4_convert.core.targets.engine_config import missing_engine_keys
from tests.helpers.cli import restored_tree, run_cli_steps, succeeded, tree_hashes

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "producers"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and (p / "config.json").exists())
UNPADDED = ["llmc-qwen3-moe-mxfp4a16", "llmc-mixtral-mxfp4a16"]
TARGETS = ("sglang", "vllm")
NO_FLAG = {"DSV4_CONVERT_ALLOW_UNSERVABLE": None}  # removed (tests/conftest.py sets it for the converter's tests)


def _format(name: str) -> str:
    """What each producer's scheme is on disk (docs/spec/CHECKPOINT_FORMATS.md §4, §5)."""
    producer, quant = name.split("-", 1)[0], "mxfp4" if "mxfp4" in name else "nvfp4"
    assert producer in ("modelopt", "llmc"), name
    return f"{quant}-modelopt-hf" if producer == "modelopt" else f"{quant}-ct"


def _json(proc) -> dict:
    """A command's --json answer; {} where it printed none (the test then shows the process's output)."""
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {}


def _served(doc: dict, target: str) -> bool:
    return any(why is None for key, why in doc.get("served", {}).items() if key.split(" ")[0] == target)


def _refused_with(proc, error_id: str) -> bool:
    return proc.returncode == 4 and _json(proc).get("error", {}).get("id") == error_id



@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every fixture's CLI steps, as test_producer_output_end_to_end reads them: (name, step) or (name, target,
    step) -> the CLI's answer, and (name, target, "out") -> the output directory."""
    work = tmp_path_factory.mktemp("producers")
    out = {(n, t): work / n / f"out-{t}" for n in CASES for t in TARGETS}
    convert = {n: [f"{_format(n)[:5]}-to-marlin", FIXTURES / n] for n in CASES}
    for n in CASES:
        (work / n).mkdir()
    # the gate as a user meets it: no DSV4_CONVERT_ALLOW_UNSERVABLE in the environment
    runs = run_cli_steps({**{(n, "inspect"): ["inspect", FIXTURES / n, "--json"] for n in CASES},
                   **{(n, t, "gate"): [*convert[n], out[n, t], "--target", t, "--json"] for n, t in out},
                   **{(n, "plan-sglang"): ["plan", FIXTURES / n, "--gpus", 1, "--gpu-mem-gib", 96, "--target", "sglang",
                                           "--json"] for n in UNPADDED}}, work, env=NO_FLAG)
    runs.update({(n, t, "written by the gate"): o.exists() for (n, t), o in out.items()})
    # the gate lifted (tests/conftest.py sets the variable): what the gate refused, and the unpadded plan's own run
    lifted = {(n, t, "lifted"): [*convert[n], out[n, t], "--target", t, "--json"]
              for n, t in out if not _served(_json(runs[n, "inspect"]), t)}
    runs.update(run_cli_steps({**lifted,
                        **{(n, "plan-vllm"): ["plan", FIXTURES / n, "--gpus", 1, "--gpu-mem-gib", 96, "--target", "vllm",
                                              "--json"] for n in UNPADDED},
                        **{(n, "convert-vllm"): ["mxfp4-to-marlin", FIXTURES / n, work / n / "unpadded", "--target",
                                                 "vllm", "-q"] for n in UNPADDED}}, work))
    last = {(n, t): runs.get((n, t, "lifted"), runs[n, t, "gate"]) for n, t in out}
    runs.update(run_cli_steps({(n, t, "tp1"): [*convert[n], out[n, t], "--target", t, "--tp", 1, "--json"]
                        for (n, t), proc in last.items() if _refused_with(proc, "convert.needs_padding")}, work))
    runs.update(run_cli_steps({**{(n, t, "validate"): ["validate", out[n, t], "--against", FIXTURES / n, "--json"]
                           for n, t in out},
                        **{(n, t, "reverse"): ["marlin-to-source", out[n, t], work / n / "back", "-q"]
                           for n, t in out if TARGETS.index(t) == len(n) % 2}}, work))
    return {**runs, **{(n, "unpadded"): work / n / "unpadded" for n in UNPADDED}, **{(n, "back"): work / n / "back" for n in CASES}}


def test_the_fixtures_and_their_record_are_there():
    versions = json.loads((FIXTURES / "versions.json").read_text())
    assert CASES and {c.split("-", 1)[0] for c in CASES} <= set(versions)
    assert (FIXTURES / "make_fixtures.py").is_file()


@pytest.mark.parametrize("name", CASES)
def test_producer_output_end_to_end(runs, name):
    src = FIXTURES / name
    inspected = runs[name, "inspect"]
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    doc = json.loads(inspected.stdout)
    assert doc["format"] == _format(name), doc["reason"]
    assert doc["projections"]["total"] > 0 and set(doc["projections"]["by_quant"]) == {_format(name)[:5]}
    config = json.loads((src / "config.json").read_text())
    assert doc["family"] == family_of(config).name, doc["family"]
    for i, target in enumerate(TARGETS):
        served, proc = _served(doc, target), runs[name, target, "gate"]
        if not served:  # the gate refuses it before writing, as validate would report it
            assert _refused_with(proc, "convert.unservable_family"), proc.stdout + proc.stderr
            assert not runs[name, target, "written by the gate"]
            proc = runs[name, target, "lifted"]
        if _refused_with(proc, "convert.needs_padding"):
            proc = runs[name, target, "tp1"]
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = runs[name, target, "validate"]
        errors = {f["check"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
        unbuildable = {"source.engine_config"} if missing_engine_keys(config) else set()
        assert errors == (set() if served else {"marlin.serving_methods"}) | unbuildable, proc.stdout[-3000:]
        if i == len(name) % 2:  # one target's output is reversed, alternating between fixtures
            succeeded(runs[name, target, "reverse"])
            assert restored_tree(runs[name, "back"]) == tree_hashes(src)


@pytest.mark.parametrize("name", UNPADDED)
def test_vllm_serves_compressed_tensors_mxfp4_unpadded(runs, name):
    """vLLM builds its compressed-tensors MXFP4 MoE method for llm-compressor's MXFP4A16, which never pads
    (core/targets/engines.py _VLLM_CT_PAD): at H = 128, where Mxfp4MoEMethod would pad H to 256, `plan` finds TP 1
    unpadded and the converter writes the layout-agnostic output without --tp (SGLang, which pads MXFP4, cannot)."""
    succeeded(runs[name, "plan-vllm"])
    plan = json.loads(runs[name, "plan-vllm"].stdout)
    assert plan["candidates"][0]["tiles"] == "ok" and plan["command"], plan["candidates"]
    succeeded(runs[name, "convert-vllm"])
    qc = json.loads((runs[name, "unpadded"] / "config.json").read_text())["quantization_config"]
    assert qc.get("tp_layout") is None and {"tp": 1, "ep": 1} in qc["layouts"], qc.get("layouts")
    refused = runs[name, "plan-sglang"]
    assert refused.returncode != 0 and json.loads(refused.stdout)["command"] is None
