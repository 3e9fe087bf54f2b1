"""The converter's routes give the same checkpoint: the numpy route (convert/cpu_path.py, the
default, no torch) and the torch route (convert/transform.py, forced with DSV4_CONVERT_TORCH_ROUTE=1),
through the real CLI in subprocesses, for every source format and both targets, and for the scale
defects that send a projection back to the torch route (lost bytes recorded, NaN refused with the same
error). Every file of the two outputs is compared byte for byte. And the default CPU conversion does
not import torch at all (its start-up cost is what the route exists for).
The same for the work split finer than a shard (convert/pieces.py: several worker processes write one
shard), against one worker writing whole shards.

Substitutions: DSV4_CONVERT_PIECE_BYTES lowers the piece size floor (64 MiB) so that checkpoints of a
few MiB split as a real-size layer does; DSV4_CONVERT_PROFILE is read back only to see that the run
did split (one profile per piece)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsv4_convert.convert.cpu_path import TORCH_ROUTE_ENV
from dsv4_convert.synth import SYNTH_FORMATS
from tests.helpers.cli import run_cli, tree_hashes


def _command(fmt: str) -> str:
    return "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"


def _both_routes(src, tmp_path, fmt, *args):
    """(numpy-route tree, torch-route tree) of one conversion; same OUT name so SERVING.md agrees."""
    trees = []
    for route, env in (("np", {}), ("torch", {TORCH_ROUTE_ENV: "1"})):
        out = tmp_path / route / "out"
        run_cli(_command(fmt), src, out, "-q", "--workers", "1", *args, env=env)
        trees.append(tree_hashes(out))
    return trees


@pytest.mark.parametrize("target", ["sglang", "vllm"])
@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_routes_give_the_same_checkpoint(synth_source, tmp_path, fmt, target):
    fast, torch_route = _both_routes(synth_source(fmt, layers=1, experts=4), tmp_path, fmt, "--target", target)
    assert fast == torch_route


@pytest.mark.parametrize("fmt, defect, target", [
    ("nvfp4-modelopt-dsv4", "negative-scale", "sglang"),  # sign dropped: the byte is recorded as lost
    ("nvfp4-ct", "negative-scale", "vllm"),
    ("nvfp4-modelopt-hf", "subnormal-scale", "vllm"),  # clamped below 2 after x128
    ("nvfp4-modelopt-dsv4", "zero-scale", "vllm"),
    ("mxfp4-dsv4", "e8m0-overflow", "sglang"),
    ("mxfp4-gptoss", "all-zero-expert", "vllm"),
])
def test_defects_give_the_same_checkpoint(synth_source, tmp_path, fmt, defect, target):
    fast, torch_route = _both_routes(synth_source(fmt, layers=1, experts=4, defects=(defect,)), tmp_path, fmt,
                                     "--target", target)
    assert fast == torch_route
    if defect in ("negative-scale", "subnormal-scale"):
        assert "dsv4-convert-source/lost_scales.safetensors" in fast, "the lost bytes are recorded for the reverse"


@pytest.mark.parametrize("fmt, defect", [("nvfp4-modelopt-dsv4", "nan-scale"), ("nvfp4-ct", "nan-global"),
                                         ("mxfp4-gptoss", "e8m0-nan")])
def test_refusals_are_the_same(synth_source, tmp_path, fmt, defect):
    src = synth_source(fmt, layers=1, experts=4, defects=(defect,))
    errors = []
    for route, env in (("np", {}), ("torch", {TORCH_ROUTE_ENV: "1"})):
        proc = run_cli(_command(fmt), src, tmp_path / route, "--json", "--workers", "1", env=env, check=False)
        assert proc.returncode == 4, proc.stderr
        errors.append(json.loads(proc.stdout)["error"])
        assert not (tmp_path / route).exists()
    assert errors[0] == errors[1] and errors[0]["id"] == "convert.bad_values"


_NO_TORCH = """
import sys
from dsv4_convert.cli.main import main
try:
    main(sys.argv[1:])
finally:
    print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


@pytest.mark.parametrize("fmt", ["nvfp4-modelopt-dsv4", "mxfp4-gptoss"])
def test_default_conversion_does_not_import_torch(synth_source, tmp_path, fmt):
    args = [_command(fmt), synth_source(fmt, layers=1, experts=4), tmp_path / "out", "-q", "--workers", "1",
            "--target", "vllm"]  # vllm: the planning pass (rescale factors) runs too
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "NO-TORCH"


_SPLIT = {"DSV4_CONVERT_PIECE_BYTES": "2000"}


def _split_run(src, tmp_path, fmt, *args):
    """The tree of a conversion with 5 workers (more than the 3 shards) whose shards are split, and the pieces it wrote."""
    prof = tmp_path / "prof-split"
    out = tmp_path / "split" / "out"
    run_cli(_command(fmt), src, out, "-q", "--workers", "5", *args,
            env={**_SPLIT, "DSV4_CONVERT_PROFILE": str(prof)})
    pieces = [p.stem for p in prof.glob("*.json") if ".safetensors.p" in p.stem]
    return tree_hashes(out), pieces


def _whole(src, tmp_path, fmt, *args):
    out = tmp_path / "whole" / "out"
    run_cli(_command(fmt), src, out, "-q", "--workers", "1", *args)
    return tree_hashes(out)


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_pieces_give_the_same_checkpoint(synth_source, tmp_path, fmt):
    src = synth_source(fmt, layers=2, experts=4)
    whole = _whole(src, tmp_path, fmt, "--target", "vllm")
    split, pieces = _split_run(src, tmp_path, fmt, "--target", "vllm")
    assert split == whole
    assert len(pieces) > len([f for f in whole if f.endswith(".safetensors") and "/" not in f]), \
        "the shards were split into more pieces than there are shards"


@pytest.mark.parametrize("fmt, defect, target, extra", [
    ("nvfp4-modelopt-dsv4", "negative-scale", "sglang", ()),  # lost bytes: each piece's sidecar is merged
    ("nvfp4-modelopt-hf", "subnormal-scale", "vllm", ()),
    ("mxfp4-dsv4", "none", "vllm", ("--tp", "2")),  # I 128 -> 64 per rank, padded to 128: the torch route
])
def test_pieces_on_the_torch_route(synth_source, tmp_path, fmt, defect, target, extra):
    defects = () if defect == "none" else (defect,)
    kwargs = {"intermediate": 128} if extra else {}
    src = synth_source(fmt, layers=2, experts=4, defects=defects, **kwargs)
    whole = _whole(src, tmp_path, fmt, "--target", target, *extra)
    split, pieces = _split_run(src, tmp_path, fmt, "--target", target, *extra)
    assert split == whole
    assert pieces
    if defects:
        assert "dsv4-convert-source/lost_scales.safetensors" in whole
