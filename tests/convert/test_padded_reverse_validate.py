"""A padded (`--tp/--ep`) output through the real CLI: `marlin-to-source` gives the input back byte
for byte (DeepSeek per-expert NVFP4, and gpt-oss stacks with interleaved gate/up rows), and refuses
non-zero padding (`reverse.padding_not_zero`); `validate` takes the recorded tp_layout as its default
--tp/--ep, passes clean (also --against the source), and an explicit other --tp/--ep is an error
naming the recorded layout. Substitutions: none (the tampering test edits a real output and re-records
its manifest, as a consistent editor would, so that the padding check itself is what refuses)."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from dsv4_convert.runtime.digest import file_digest
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import restored_tree, run_cli, tree_hashes

MANIFEST = "dsv4-convert.manifest.json"


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """(source, its padded vLLM TP 2 output): MXFP4 DSV4, H=256, I=128 -> I_shard 64 -> 128."""
    root = tmp_path_factory.mktemp("pad")
    src = make_checkpoint(root / "src", "mxfp4-dsv4", layers=1, experts=2, hidden=256, inter=128, shards=2).root
    run_cli("mxfp4-to-marlin", src, root / "out", "--target", "vllm", "--tp", 2, "-q")
    return src, root / "out"


@pytest.mark.parametrize("fmt, cmd, args", [
    ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", ("--target", "vllm", "--tp", 1)),  # I=96 -> 128, rescaled scales
    ("mxfp4-gptoss", "mxfp4-to-marlin", ("--target", "sglang", "--tp", 2, "--ep", 1)),  # I=256, H 128 -> 256
])
def test_marlin_to_source_of_a_padded_output_is_the_input(tmp_path, fmt, cmd, args):
    src = make_checkpoint(tmp_path / "src", fmt, layers=1, experts=2, hidden=128, inter=96 if "nv" in fmt else 256,
                          shards=2).root
    out, back = tmp_path / "out", tmp_path / "back"
    run_cli(cmd, src, out, *args, "-q")
    assert "tp_layout" in json.loads((out / "config.json").read_text())["quantization_config"]
    run_cli("marlin-to-source", out, back, "-q")
    assert restored_tree(back) == tree_hashes(src)
    proc = run_cli("validate", out, "--against", src, "--json", check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["summary"]["warnings"] == 0, proc.stdout[-3000:]


def _poke(path, name: str, at: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin = json.loads(raw[8:8 + n])[name]["data_offsets"][0]
    raw[8 + n + begin + at] = value
    path.write_bytes(bytes(raw))


def _rerecord(root, rel: str) -> None:
    doc = json.loads((root / MANIFEST).read_text())
    doc["files"][rel] = dict(doc["files"][rel], size=(root / rel).stat().st_size,
                             hash=file_digest(root / rel, doc["hash_algorithm"]))
    (root / MANIFEST).write_text(json.dumps(doc))


def test_marlin_to_source_refuses_non_zero_padding(tmp_path, padded):
    _, out = padded
    ck = tmp_path / "ck"
    run_cli("marlin-to-source", out, tmp_path / "ok", "-q")  # the untouched output reverses
    shutil.copytree(out, ck)
    index = json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"]
    name = "layers.0.ffn.experts.0.w2.weight_scale"  # [2 ranks * 128 / 32, 256]: rank 0's rows 2, 3 are K padding
    _poke(ck / index[name], name, 2 * 256, 127)
    _rerecord(ck, index[name])
    proc = run_cli("marlin-to-source", ck, tmp_path / "back", "-q", check=False)
    assert proc.returncode == 4 and "reverse.padding_not_zero" in proc.stderr, proc.stderr
    assert "layers.0.ffn.experts.0.w2" in proc.stderr and "TP 2 / EP 1" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "back").exists()


def test_validate_defaults_to_the_recorded_layout_and_passes_clean(padded):
    src, out = padded
    for extra in ((), ("--against", src), ("--tp", 2, "--ep", 1)):
        proc = run_cli("validate", out, "--json", *extra, check=False)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert report["summary"]["errors"] == 0 and report["summary"]["warnings"] == 0, report["summary"]


@pytest.mark.parametrize("args", [("--tp", 1), ("--tp", 2, "--ep", 2), ("--tp", 4)])
def test_validate_with_another_split_names_the_recorded_layout(padded, args):
    _, out = padded
    proc = run_cli("validate", out, *args, check=False)
    assert proc.returncode == 1
    assert "structure.tile.tp" in proc.stdout and "converted for TP 2 / EP 1 only" in proc.stdout, proc.stdout
