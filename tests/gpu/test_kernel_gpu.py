"""validate --kernel on the GPU with vLLM 0.33.0's real Marlin kernels (the `module` provider).

Substitutions: the engine is the test build of vLLM 0.33.0's Marlin kernels (../shared/marlin-kernels,
sources unchanged; the device has no vLLM), loaded through --kernel-provider module:PATH; or SGLang 0.5.23's own JIT ops
(--kernel-provider sglang, the test build of its wheel's sources: tests/gpu/run.sh VERSIONS=sglang).
Checkpoints are `dsv4-convert synth` outputs converted by the real CLI (a test's command lines in one CLI
process: run_cli_batch); broken outputs are made by editing the converted safetensors files (each edit is one
defect a converter could make).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.formats.marlin.scales import unpermute_scale_columns
from dsv4_convert.validate.checks.kernel import KERNEL_REL_ERROR_MAX
from tests.helpers.cli import run_cli_batch, succeeded
from tests.helpers.kernel_cli import PROVIDER, TARGETS, kernel_args, kernel_report, needs_kernels, run_cli
from tests.helpers.kernel_cli import edit as _edit
from tests.helpers.kernel_cli import kernel as _kernel
from tests.helpers.kernel_cli import record as _record
from tests.helpers.kernel_cli import status as _status

pytestmark = needs_kernels


@pytest.fixture(scope="session")
def module_path():
    return PROVIDER


FORMATS = ("nvfp4-modelopt-dsv4", "nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-dsv4", "mxfp4-ct", "mxfp4-gptoss")
CASES = [(f, t, a) for f in FORMATS for t in TARGETS for a in ("bfloat16", "float16")
         if not (f.startswith("mxfp4") and a == "float16")]  # no fp16 MXFP4 Marlin kernel in either engine


@pytest.fixture(scope="session")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    for proc in run_cli_batch([["synth", root / fmt, "--format", fmt, "--layers", "1", "--experts", "8"]
                               for fmt in FORMATS], root):
        succeeded(proc)
    return {fmt: root / fmt for fmt in FORMATS}


def _convert_args(src: Path, fmt: str, target: str, act: str, out: Path) -> list:
    cmd = "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"
    return [cmd, src, out, "--target", target, "--act-dtype", act, "-q"]


def _convert(src: Path, fmt: str, target: str, act: str, out: Path) -> Path:
    run_cli(*_convert_args(src, fmt, target, act, out))
    return out


@pytest.mark.parametrize("fmt,target,act", CASES)
def test_kernel_passes_on_converted_output(sources, module_path, tmp_path, fmt, target, act):
    out, src = tmp_path / "out", sources[fmt]
    converted, *runs = run_cli_batch([_convert_args(src, fmt, target, act, out), kernel_args(out, module_path),
                                      kernel_args(out, module_path, "--against", src),
                                      kernel_args(src, module_path, "--target", target, "--act-dtype", act)], tmp_path)
    succeeded(converted)
    decoded, against, source = (kernel_report(r) for r in runs)
    for data in (decoded, against, source):  # the kernel's question only: a format no plugin is proven to serve yet (the
        # synth family's row, e.g. DeepSeek-V3 in compressed-tensors) is marlin.serving_methods' error, not the kernel's
        assert _errors(data) <= {"marlin.serving_methods"}, _errors(data)
    for name, data in (("decoded", decoded), ("against", against), ("source", source)):
        assert data["kernel"], name
        assert _status(data, "kernel.gemm") == "pass", name
        worst = max(r["max_rel_error"] for r in data["kernel"])
        assert worst <= KERNEL_REL_ERROR_MAX[act]
        _record(case=f"{fmt}/{target}/{act}", reference=name, max_rel_error=worst,
                stacks=len(data["kernel"]), repack=_status(data, "kernel.repack"))
    assert _status(against, "kernel.repack") == "pass" and _status(source, "kernel.repack") == "pass"


def _errors(data) -> set[str]:
    return {f["check"] for f in data["findings"] if f["severity"] == "error"}


# ------------------------------------------------------------------------------- negative controls
def _tensors(out: Path, expert: int, role: Role):
    p = next(p for p in open_checkpoint(out).projections if p.layer == "0" and p.expert == expert and p.role is role)
    return p


def _swap_nibbles(t):
    b = t.view(torch.uint8)
    return (((b & 0x0F) << 4) | (b >> 4)).view(t.dtype)


def _transpose_tile(t):
    t = t.clone()
    t[..., :8, :8] = t[..., :8, :8].transpose(-1, -2).clone()
    return t


def _unpermute(t):
    return unpermute_scale_columns(t.view(torch.uint8)).view(t.dtype)


def _swap_experts(out: Path, a: int, b: int, role: Role):
    pa, pb = _tensors(out, a, role), _tensors(out, b, role)
    for ra, rb in ((pa.weight, pb.weight), (pa.scale, pb.scale), (pa.marlin_global, pb.marlin_global)):
        if ra is None:
            continue
        ta = load_file(out / ra.file)[ra.name].clone()
        tb = load_file(out / rb.file)[rb.name].clone()
        _edit(out, ra.name, lambda _: tb)
        _edit(out, rb.name, lambda _: ta)


CONTROLS = {
    # name: (edit, expected kernel.* checks that must fail, experts the gemm finding must name)
    "swapped-nibbles": (lambda o: _edit(o, _tensors(o, 2, Role.DOWN).weight.name, _swap_nibbles),
                        {"kernel.gemm", "kernel.repack"}, {2}),
    "transposed-tile": (lambda o: _edit(o, _tensors(o, 2, Role.GATE).weight.name, _transpose_tile),
                        {"kernel.gemm", "kernel.repack"}, {2}),
    "unpermuted-scales": (lambda o: _edit(o, _tensors(o, 2, Role.UP).scale.name, _unpermute), {"kernel.gemm"}, {2}),
    "global-not-rescaled": (lambda o: _edit(o, _tensors(o, 2, Role.DOWN).marlin_global.name, lambda g: g * 16),
                            {"kernel.gemm"}, {2}),
    "swapped-experts": (lambda o: _swap_experts(o, 0, 1, Role.DOWN), {"kernel.gemm", "kernel.repack"}, {0, 1}),
}


@pytest.mark.parametrize("fmt,target,act", [c for c in [("nvfp4-modelopt-dsv4", "vllm", "bfloat16"),
                                                          ("nvfp4-modelopt-dsv4", "sglang", "bfloat16"),
                                                          ("nvfp4-ct", "sglang", "float16"),
                                                          ("mxfp4-dsv4", "sglang", "bfloat16")] if c[1] in TARGETS])
@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_kernel_fails_on_broken_output(sources, module_path, tmp_path, fmt, target, act, control):
    if control == "global-not-rescaled" and fmt.startswith("mxfp4"):
        pytest.skip("MXFP4 has no global scale")
    out = _convert(sources[fmt], fmt, target, act, tmp_path / "out")
    edit, expected, experts = CONTROLS[control]
    edit(out)
    data = _kernel(out, module_path, "--against", sources[fmt], check_rc=1)
    failed = {c["id"] for c in data["checks"] if c["id"].startswith("kernel.") and c["status"] == "fail"}
    assert failed == expected, failed
    named = {f["expert"] for f in data["findings"] if f["check"] == "kernel.gemm"}
    assert named == experts
    worst = max(f["value"] or float("inf") for f in data["findings"] if f["check"] == "kernel.gemm")
    _record(control=control, case=f"{fmt}/{target}/{act}", failed=sorted(failed), experts=sorted(named),
            worst_rel_error=worst)
