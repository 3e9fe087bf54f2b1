"""The converter's two routes give the same checkpoint: the numpy route (convert/cpu_path.py, the
default, no torch) and the torch route (convert/transform.py, forced with DSV4_CONVERT_TORCH_ROUTE=1),
through the real CLI in subprocesses, for every source format and both targets, and for the scale
defects that send a projection back to the torch route (lost bytes recorded, NaN refused with the same
error). Every file of the two outputs is compared byte for byte. And the default CPU conversion does
not import torch at all (its start-up cost is what the route exists for).
No substitutions: real synthetic checkpoints, the real CLI."""

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
