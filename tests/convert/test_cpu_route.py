"""The converter's routes give the same checkpoint: the numpy route (convert/cpu_path.py, the
default, no torch) and the torch route (convert/transform.py, forced with DSV4_CONVERT_TORCH_ROUTE=1),
through the real CLI command lines, for every source format and both targets, and for the scale
defects that send a projection back to the torch route (lost bytes recorded, NaN refused with the same
error). Every file of the two outputs is compared byte for byte. And the default CPU conversion does
not import torch at all (its start-up cost is what the route exists for).
The same for the work split finer than a shard (convert/pieces.py: several worker processes write one
shard), against one worker writing whole shards.

Substitutions: the route comparisons' and the whole-shard runs' command lines run in one CLI process per route
(run_cli_batch: `main(argv)` each, as the console script runs it; DSV4_CONVERT_TORCH_ROUTE is that process's
environment), not one process each: a process start costs more than these conversions. The no-torch check and
the split runs (a test hook, worker processes) keep a process of their own. DSV4_CONVERT_PIECE_BYTES lowers the piece size floor (64 MiB) so that checkpoints of a
few MiB split as a real-size layer does; DSV4_CONVERT_PROFILE is read back only to see that the run
did split (one profile per piece)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsv4_convert.convert.cpu_path import TORCH_ROUTE_ENV
from dsv4_convert.synth import SYNTH_FORMATS
from tests.helpers.cli import run_cli, run_cli_batch, tree_hashes


def _command(fmt: str) -> str:
    return "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"


ROUTES = {"np": {}, "torch": {TORCH_ROUTE_ENV: "1"}}
_ROUTE_CASES = [(fmt, (), target) for fmt in SYNTH_FORMATS for target in ("sglang", "vllm")]
_DEFECT_CASES = [
    ("nvfp4-modelopt-dsv4", "negative-scale", "sglang"),  # sign dropped: the byte is recorded as lost
    ("nvfp4-ct", "negative-scale", "vllm"),
    ("nvfp4-modelopt-hf", "subnormal-scale", "vllm"),  # clamped below 2 after x128
    ("nvfp4-modelopt-dsv4", "zero-scale", "vllm"),
    ("mxfp4-dsv4", "e8m0-overflow", "sglang"),
    ("mxfp4-gptoss", "all-zero-expert", "vllm"),
]
_REFUSAL_CASES = [("nvfp4-modelopt-dsv4", "nan-scale"), ("nvfp4-ct", "nan-global"), ("mxfp4-gptoss", "e8m0-nan")]
_PIECE_CASES = [(fmt, "none", "vllm", ()) for fmt in SYNTH_FORMATS] + [
    ("nvfp4-modelopt-dsv4", "negative-scale", "sglang", ()),  # lost bytes: each piece's sidecar is merged
    ("nvfp4-modelopt-hf", "subnormal-scale", "vllm", ()),
    ("mxfp4-dsv4", "none", "vllm", ("--tp", "2")),  # I 128 -> 64 per rank, padded to 128: the torch route
]


def _piece_source(synth_source, fmt, defect, extra):
    return synth_source(fmt, layers=2, experts=4, defects=() if defect == "none" else (defect,),
                        **({"intermediate": 128} if extra else {}))


@pytest.fixture(scope="module")
def runs(synth_source, tmp_path_factory) -> dict:
    """Every route comparison's conversions, once per route: (case, route) -> (the CLI's answer, its OUT), where a
    case is ("routes" | "defects", fmt, defects, target), ("refusal", fmt, defect) or ("whole", *piece case); each
    route's command lines in one CLI process (run_cli_batch), the whole-shard runs with the numpy route's."""
    work = tmp_path_factory.mktemp("routes")
    lines: dict = {}
    for fmt, defects, target in _ROUTE_CASES + [(f, (d,), t) for f, d, t in _DEFECT_CASES]:
        src = synth_source(fmt, layers=1, experts=4, **({"defects": defects} if defects else {}))
        lines["defects" if defects else "routes", fmt, defects, target] = \
            [_command(fmt), src, "-q", "--workers", "1", "--target", target]
    for fmt, defect in _REFUSAL_CASES:
        lines["refusal", fmt, defect] = [_command(fmt), synth_source(fmt, layers=1, experts=4, defects=(defect,)),
                                         "--json", "--workers", "1"]
    answers = {}
    for route, env in ROUTES.items():
        # the same OUT name in both routes (route / "out") so that SERVING.md agrees; a refusal's OUT is route
        outs = {case: work / str(n) / route / ("out" if case[0] != "refusal" else "") for n, case in enumerate(lines)}
        steps = {case: [argv[0], argv[1], outs[case], *argv[2:]] for case, argv in lines.items()}
        if route == "np":
            for n, (fmt, defect, target, extra) in enumerate(_PIECE_CASES):
                case = ("whole", fmt, defect, target, extra)
                outs[case] = work / f"whole-{n}" / "out"
                steps[case] = [_command(fmt), _piece_source(synth_source, fmt, defect, extra), outs[case], "-q",
                               "--workers", "1", "--target", target, *extra]
        answers.update({(case, route): (proc, outs[case])
                        for case, proc in zip(steps, run_cli_batch(list(steps.values()), work, env=env))})
    return answers


def _same_route_trees(runs, case) -> list[dict]:
    """(numpy-route tree, torch-route tree) of one conversion."""
    trees = []
    for route in ROUTES:
        proc, out = runs[case, route]
        assert proc.returncode == 0, f"{route} route: {proc.stderr[-3000:]}"
        trees.append(tree_hashes(out))
    return trees


@pytest.mark.parametrize("target", ["sglang", "vllm"])
@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_routes_give_the_same_checkpoint(runs, fmt, target):
    fast, torch_route = _same_route_trees(runs, ("routes", fmt, (), target))
    assert fast == torch_route


@pytest.mark.parametrize("fmt, defect, target", _DEFECT_CASES)
def test_defects_give_the_same_checkpoint(runs, fmt, defect, target):
    fast, torch_route = _same_route_trees(runs, ("defects", fmt, (defect,), target))
    assert fast == torch_route
    if defect in ("negative-scale", "subnormal-scale"):
        assert "dsv4-convert-source/lost_scales.safetensors" in fast, "the lost bytes are recorded for the reverse"


@pytest.mark.parametrize("fmt, defect", _REFUSAL_CASES)
def test_refusals_are_the_same(runs, fmt, defect):
    errors = []
    for route in ROUTES:
        proc, out = runs[("refusal", fmt, defect), route]
        assert proc.returncode == 4, proc.stderr
        errors.append(json.loads(proc.stdout)["error"])
        assert not out.exists()
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


def _whole(runs, case):
    proc, out = runs[("whole", *case), "np"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tree_hashes(out)


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_pieces_give_the_same_checkpoint(runs, synth_source, tmp_path, fmt):
    case = (fmt, "none", "vllm", ())
    whole = _whole(runs, case)
    split, pieces = _split_run(_piece_source(synth_source, *case[:2], ()), tmp_path, fmt, "--target", "vllm")
    assert split == whole
    assert len(pieces) > len([f for f in whole if f.endswith(".safetensors") and "/" not in f]), \
        "the shards were split into more pieces than there are shards"


@pytest.mark.parametrize("fmt, defect, target, extra", _PIECE_CASES[len(SYNTH_FORMATS):])
def test_pieces_on_the_torch_route(runs, synth_source, tmp_path, fmt, defect, target, extra):
    whole = _whole(runs, (fmt, defect, target, extra))
    split, pieces = _split_run(_piece_source(synth_source, fmt, defect, extra), tmp_path, fmt, "--target", target, *extra)
    assert split == whole
    assert pieces
    if defect != "none":
        assert "dsv4-convert-source/lost_scales.safetensors" in whole
