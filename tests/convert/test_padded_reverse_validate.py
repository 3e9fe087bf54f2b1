"""A padded (`--tp/--ep`) output through the real CLI: `marlin-to-source` gives the input back byte
for byte (DeepSeek per-expert NVFP4, and gpt-oss stacks with interleaved gate/up rows), and refuses
non-zero padding (`reverse.padding_not_zero`); `validate` takes the recorded tp_layout as its default
--tp/--ep, passes clean (also --against the source), and an explicit other --tp/--ep is an error
naming the recorded layout. Substitutions: the command lines run in two CLI processes (run_cli_batch: `main(argv)`
each, as the console script runs it, its exit code, stdout and stderr), the clean runs' then the tampered copy's,
not one process each: a process start costs more than these commands. The tampering test edits a real output
and re-records its manifest, as a consistent editor would, so that the padding check itself is what refuses."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from dsv4_convert.runtime.digest import file_digest
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import restored_tree, run_cli_batch, tree_hashes

MANIFEST = "dsv4-convert.manifest.json"


PADDED_CASES = [
    ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", ("--target", "vllm", "--tp", 1)),  # I=96 -> 128, rescaled scales
    ("mxfp4-gptoss", "mxfp4-to-marlin", ("--target", "sglang", "--tp", 2, "--ep", 1)),  # I=256, H 128 -> 256
]
RECORDED = [(), ("--against", "SRC"), ("--tp", 2, "--ep", 1)]  # SRC: the padded output's source
OTHER_SPLITS = [("--tp", 1), ("--tp", 2, "--ep", 2), ("--tp", 4)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, case, step) -> the CLI's answer, and the paths: "src"/"out" the padded vLLM TP 2 output of an MXFP4
    DSV4 source (H=256, I=128 -> I_shard 64 -> 128), validated and reversed; PADDED_CASES' sources converted,
    reversed and validated; then a copy of "out" with non-zero padding reversed, in a second CLI process."""
    root = tmp_path_factory.mktemp("pad")
    src = make_checkpoint(root / "src", "mxfp4-dsv4", layers=1, experts=2, hidden=256, inter=128, shards=2).root
    paths = {"src": src, "out": root / "out", "ok": root / "ok", "ck": root / "ck", "back": root / "back"}
    steps = {("padded", None, "convert"): ["mxfp4-to-marlin", src, paths["out"], "--target", "vllm", "--tp", 2, "-q"],
             ("refuses", None, "ok"): ["marlin-to-source", paths["out"], paths["ok"], "-q"],  # the untouched output
             **{("recorded", i, "validate"): ["validate", paths["out"], "--json", *(src if a == "SRC" else a for a in extra)]
                for i, extra in enumerate(RECORDED)},
             **{("other", args, "validate"): ["validate", paths["out"], *args] for args in OTHER_SPLITS}}
    for fmt, cmd, args in PADDED_CASES:
        d = root / fmt
        case_src = make_checkpoint(d / "src", fmt, layers=1, experts=2, hidden=128, inter=96 if "nv" in fmt else 256,
                                   shards=2).root
        paths[fmt] = d
        steps.update({("case", fmt, "convert"): [cmd, case_src, d / "out", *args, "-q"],
                      ("case", fmt, "reverse"): ["marlin-to-source", d / "out", d / "back", "-q"],
                      ("case", fmt, "validate"): ["validate", d / "out", "--against", case_src, "--json"]})
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), root)))
    assert runs["padded", None, "convert"].returncode == 0, runs["padded", None, "convert"].stderr
    shutil.copytree(paths["out"], paths["ck"])
    index = json.loads((paths["ck"] / "model.safetensors.index.json").read_text())["weight_map"]
    name = "layers.0.ffn.experts.0.w2.weight_scale"  # [2 ranks * 128 / 32, 256]: rank 0's rows 2, 3 are K padding
    _poke(paths["ck"] / index[name], name, 2 * 256, 127)
    _rerecord(paths["ck"], index[name])
    (runs["refuses", None, "dirty"],) = run_cli_batch([["marlin-to-source", paths["ck"], paths["back"], "-q"]], root)
    return {**runs, **paths}


@pytest.mark.parametrize("fmt, cmd, args", PADDED_CASES)
def test_marlin_to_source_of_a_padded_output_is_the_input(runs, fmt, cmd, args):
    d = runs[fmt]
    for step in ("convert", "reverse"):
        assert runs["case", fmt, step].returncode == 0, runs["case", fmt, step].stderr
    assert "tp_layout" in json.loads((d / "out" / "config.json").read_text())["quantization_config"]
    assert restored_tree(d / "back") == tree_hashes(d / "src")
    proc = runs["case", fmt, "validate"]
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


def test_marlin_to_source_refuses_non_zero_padding(runs):
    assert runs["refuses", None, "ok"].returncode == 0, runs["refuses", None, "ok"].stderr  # the untouched output
    proc = runs["refuses", None, "dirty"]
    assert proc.returncode == 4 and "reverse.padding_not_zero" in proc.stderr, proc.stderr
    assert "layers.0.ffn.experts.0.w2" in proc.stderr and "TP 2 / EP 1" in proc.stderr
    assert "Traceback" not in proc.stderr and not runs["back"].exists()


def test_validate_defaults_to_the_recorded_layout_and_passes_clean(runs):
    for i in range(len(RECORDED)):
        proc = runs["recorded", i, "validate"]
        report = json.loads(proc.stdout)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert report["summary"]["errors"] == 0 and report["summary"]["warnings"] == 0, report["summary"]


@pytest.mark.parametrize("args", OTHER_SPLITS)
def test_validate_with_another_split_names_the_recorded_layout(runs, args):
    proc = runs["other", args, "validate"]
    assert proc.returncode == 1
    assert "structure.tile.tp" in proc.stdout and "converted for TP 2 / EP 1 only" in proc.stdout, proc.stdout
