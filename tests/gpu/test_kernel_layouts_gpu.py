"""validate --kernel on the GPU: padded (--tp/--ep) layouts, shapes that need the engine's padding,
and the engine's own rounding of an NVFP4 global, with vLLM 0.33.0's real Marlin kernels.

Substitutions: as tests/gpu/test_kernel_gpu.py: the engine is the test build of vLLM 0.33.0's Marlin
kernels (../shared/marlin-kernels, loaded through --kernel-provider module:PATH; the device has no
vLLM or SGLang; the SGLang build runs SGLang's own ops: tests/gpu/run.sh); checkpoints are `synth` outputs converted by the real CLI. Broken layouts are made
by editing converted files: two ranks' blocks swapped (rank block geometry by plain index arithmetic
from the recorded tp_layout, not with formats/padded_layout.py, the code under test), or one expert
re-encoded by the project's CPU codec from a source matrix padded at the FRONT of each rank block.
The small global is made by editing one expert's global in the source (a clean checkpoint whose down
weights are small; every other byte as synth wrote it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin
from dsv4_convert.validate.checks.kernel import KERNEL_REL_ERROR_MAX
from tests.helpers.cli import run_cli_batch, succeeded
from tests.helpers.kernel_cli import (
    PROVIDER,
    TARGETS,
    edit,
    kernel,
    kernel_args,
    kernel_report,
    needs_kernels,
    record,
    run_cli,
    status,
)

pytestmark = needs_kernels

# id: (format, target, act dtype, synth sizes, tp, ep): every padded layout of issue 21
PADDED = {
    "dsv4-nvfp4-I256-tp8-vllm-bf16": ("nvfp4-modelopt-dsv4", "vllm", "bfloat16", {"intermediate": 256}, 8, 1),
    "dsv4-nvfp4-I256-tp8-vllm-fp16": ("nvfp4-modelopt-dsv4", "vllm", "float16", {"intermediate": 256}, 8, 1),
    "dsv4-mxfp4-I256-tp8-vllm": ("mxfp4-dsv4", "vllm", "bfloat16", {"intermediate": 256}, 8, 1),
    "dsv4-mxfp4-I256-tp8-sglang": ("mxfp4-dsv4", "sglang", "bfloat16", {"intermediate": 256}, 8, 1),
    "dsv4-mxfp4-I1536-tp8-vllm": ("mxfp4-dsv4", "vllm", "bfloat16", {"intermediate": 1536}, 8, 1),
    "dsv4-mxfp4-I1536-tp8-sglang": ("mxfp4-dsv4", "sglang", "bfloat16", {"intermediate": 1536}, 8, 1),
    "dsv4-mxfp4-I256-tp8-ep2-vllm": ("mxfp4-dsv4", "vllm", "bfloat16", {"intermediate": 256}, 8, 2),
    "dsv4-mxfp4-I256-tp8-ep2-sglang": ("mxfp4-dsv4", "sglang", "bfloat16", {"intermediate": 256}, 8, 2),
    "gptoss-H2880-tp2-vllm": ("mxfp4-gptoss", "vllm", "bfloat16", {"hidden": 2880, "intermediate": 2880}, 2, 1),
    "gptoss-H2880-tp2-sglang": ("mxfp4-gptoss", "sglang", "bfloat16", {"hidden": 2880, "intermediate": 2880}, 2, 1),
}


def _synth_args(path: Path, fmt: str, sizes: dict, experts: int = 4) -> list:
    return ["synth", path, "--format", fmt, "--layers", "1", "--experts", experts,
            *(a for k, v in sizes.items() for a in (f"--{k}", v))]


def _synth(path: Path, fmt: str, sizes: dict, experts: int = 4) -> Path:
    run_cli(*_synth_args(path, fmt, sizes, experts))
    return path


def _convert_args(src: Path, fmt: str, target: str, act: str, out: Path, *layout) -> list:
    cmd = "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"
    return [cmd, src, out, "--target", target, "--act-dtype", act, "-q", *layout]


def _convert(src: Path, fmt: str, target: str, act: str, out: Path, *layout) -> Path:
    run_cli(*_convert_args(src, fmt, target, act, out, *layout))
    return out


def _batch(tmp_path: Path, *commands, steps: int) -> list:
    """The command lines in one CLI process (run_cli_batch); the first `steps` must succeed (synth, convert), the
    rest are validate --kernel runs: their answers."""
    answers = run_cli_batch(list(commands), tmp_path)
    for proc in answers[:steps]:
        succeeded(proc)
    return answers[steps:]


def _worst(data) -> float:
    return max(r["max_rel_error"] for r in data["kernel"])


def _notes(data) -> str:
    return " ".join(data["summary"]["notes"])


def _failed_kernel_checks(data) -> set[str]:
    return {c["id"] for c in data["checks"] if c["id"].startswith("kernel.") and c["status"] == "fail"}


def _layout(out: Path) -> dict:
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    rec = qc["tp_layout"]
    (c,) = rec["containers"].values()
    return {"m": rec["tp"] // rec["ep"], **c}


def _projection(path: Path, expert: int, role: Role):
    return next(p for p in open_checkpoint(path).projections if p.layer == "0" and p.expert == expert
                and p.role is role)


# ------------------------------------------------------------------------------- clean: all pass
@pytest.mark.parametrize("case", sorted(c for c in PADDED if PADDED[c][1] in TARGETS))
def test_every_padded_layout_passes(tmp_path, case):
    fmt, target, act, sizes, tp, ep = PADDED[case]
    src, out = tmp_path / "src", tmp_path / "out"
    answers = _batch(tmp_path, _synth_args(src, fmt, sizes), _convert_args(src, fmt, target, act, out, "--tp", tp, "--ep", ep),
                     kernel_args(out, PROVIDER, "--against", src), kernel_args(out, PROVIDER),
                     kernel_args(src, PROVIDER, "--target", target, "--act-dtype", act, "--tp", tp, "--ep", ep), steps=2)
    against, decoded, source = (kernel_report(a, check_rc=0) for a in answers)
    for name, data in (("against", against), ("decoded", decoded), ("source", source)):
        assert data["kernel"] and status(data, "kernel.gemm") == "pass", name
        assert _worst(data) <= KERNEL_REL_ERROR_MAX[act], name
        record(padded=case, reference=name, max_rel_error=_worst(data), repack=status(data, "kernel.repack"))
    assert status(against, "kernel.repack") == "pass" and status(source, "kernel.repack") == "pass"
    assert "against the source padded the same way" in _notes(against)
    assert "checked without --against" in _notes(decoded)  # the report says what decoded mode cannot see
    assert "padded per rank as" in _notes(source)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt,sizes", [("mxfp4-gptoss", {"hidden": 2880, "intermediate": 2880}),
                                       ("mxfp4-dsv4", {"intermediate": 96})])
def test_source_shapes_the_engine_pads_run_padded(tmp_path, fmt, sizes, target):
    """gpt-oss H = I = 2880 (w2 off the tile rule: was SIGSEGV) and I = 96 (was a traceback) at TP 1:
    prepared as the engine pads them, and the same as a --tp 1 conversion checked against the source."""
    src, out = tmp_path / "src", tmp_path / "out"
    answers = _batch(tmp_path, _synth_args(src, fmt, sizes, experts=2),
                     _convert_args(src, fmt, target, "bfloat16", out, "--tp", 1),
                     kernel_args(src, PROVIDER, "--target", target), kernel_args(out, PROVIDER, "--against", src), steps=2)
    source, against = (kernel_report(a, check_rc=0) for a in answers)
    for name, data in (("source", source), ("against", against)):
        assert status(data, "kernel.gemm") == "pass" and status(data, "kernel.repack") == "pass", name
        record(shape=f"{fmt}/{sizes}/{target}", reference=name, max_rel_error=_worst(data))


# ------------------------------------------------------------------------ broken layouts: all fail
def _swap_rank_blocks(out: Path, expert: int) -> None:
    """Ranks 0 and 1 of one expert's down projection (weight and scale) trade places. Down stacks the
    ranks along K: weight [m*i_pad/16, 2*h_pad] and scale [m*i_pad/g, h_pad], rank r's rows r*i_pad/16.. / r*i_pad/g.."""
    t, p = _layout(out), _projection(out, expert, Role.DOWN)
    for ref, rows in ((p.weight, t["i_pad"] // 16), (p.scale, t["i_pad"] // (16 if "nvfp4" in p.quant.value else 32))):
        def swap(x, rows=rows):
            y = x.clone()
            y[:rows], y[rows:2 * rows] = x[rows:2 * rows], x[:rows]
            return y
        edit(out, ref.name, swap)


def _front_padded(out: Path, src: Path, expert: int, target: MarlinTarget) -> None:
    """One MXFP4 expert's gate re-encoded from a source matrix whose zero padding sits at the FRONT of
    each rank block (rows [r*i_pad, r*i_pad + pad) zero, then the rank's i_shard source rows)."""
    t, p, sp = _layout(out), _projection(out, expert, Role.GATE), _projection(src, expert, Role.GATE)
    ckpt = open_checkpoint(src)
    with TensorReader(ckpt.root) as reader:
        d = load_projection(reader, sp, fmt=ckpt.format)
    w0, s0 = d.weight.view(torch.uint8), d.scale.view(torch.uint8)
    m, i_s, i_pad, h, h_pad = t["m"], t["i_shard"], t["i_pad"], t["hidden"], t["h_pad"]
    w = torch.zeros(m * i_pad, h_pad // 2, dtype=torch.uint8)
    s = torch.zeros(m * i_pad, h_pad // 32, dtype=torch.uint8)
    for r in range(m):
        row = r * i_pad + (i_pad - i_s)
        w[row:row + i_s, :h // 2] = w0[r * i_s:(r + 1) * i_s]
        s[row:row + i_s, :h // 32] = s0[r * i_s:(r + 1) * i_s]
    q, sc = mxfp4_to_marlin(w, s, target=target)
    assert q.shape == load_file(out / p.weight.file)[p.weight.name].shape
    assert sc.shape == load_file(out / p.scale.file)[p.scale.name].shape
    edit(out, p.weight.name, lambda old: q.view(old.dtype))
    edit(out, p.scale.name, lambda old: sc.view(old.dtype))


NEGATIVES = {
    # id: (padded case, edit, kernel checks that must fail with --against)
    "rank-swapped-nvfp4": ("dsv4-nvfp4-I256-tp8-vllm-bf16", "swap", {"kernel.gemm", "kernel.repack"}),
    "rank-swapped-gptoss": ("gptoss-H2880-tp2-sglang", "swap", {"kernel.gemm", "kernel.repack"}),
    "front-padded-mxfp4": ("dsv4-mxfp4-I256-tp8-vllm", "front", {"kernel.gemm", "kernel.repack"}),
    "front-padded-ep2": ("dsv4-mxfp4-I256-tp8-ep2-vllm", "front", {"kernel.gemm", "kernel.repack"}),
    "front-padded-mxfp4-sglang": ("dsv4-mxfp4-I256-tp8-sglang", "front", {"kernel.gemm", "kernel.repack"}),
}


@pytest.mark.parametrize("name", sorted(n for n in NEGATIVES if PADDED[NEGATIVES[n][0]][1] in TARGETS))
def test_broken_padded_layouts_fail_with_against(tmp_path, name):
    case, how, expected = NEGATIVES[name]
    fmt, target, act, sizes, tp, ep = PADDED[case]
    src = _synth(tmp_path / "src", fmt, sizes)
    out = _convert(src, fmt, target, act, tmp_path / "out", "--tp", tp, "--ep", ep)
    if how == "swap":
        _swap_rank_blocks(out, 1)
    else:
        _front_padded(out, src, 1, MarlinTarget(target, act))
    data = kernel(out, PROVIDER, "--against", src, "--no-verify-manifest", check_rc=1)
    assert _failed_kernel_checks(data) == expected
    assert {f["expert"] for f in data["findings"] if f["check"] == "kernel.gemm"} == {1}
    worst = max(f["value"] or float("inf") for f in data["findings"] if f["check"] == "kernel.gemm")
    # decoded mode computes what the bytes mean, so a misplaced block is invisible there (docs/VALIDATE.md)
    decoded = kernel(out, PROVIDER, "--no-verify-manifest")
    assert status(decoded, "kernel.gemm") == "pass" and "checked without --against" in _notes(decoded)
    record(negative=name, failed=sorted(_failed_kernel_checks(data)), worst_rel_error=worst,
           decoded=status(decoded, "kernel.gemm"))


# ----------------------------------------------------- the engine's own rounding of a small global
SUBNORMAL = 167.5 * 2.0**-24  # ~1.0e-5: SGLang's fp16 global rounds it to 168 * 2**-24, 0.30% off


@pytest.mark.skipif("sglang" not in TARGETS, reason="an SGLang-target case: not on this engine's kernels")
def test_fp16_subnormal_global_is_the_engines_rounding_a_warning(tmp_path):
    fmt = "nvfp4-modelopt-dsv4"
    src = _synth(tmp_path / "src", fmt, {})
    down = _projection(src, 0, Role.DOWN)
    edit(src, down.global_scale.name, lambda g: torch.full_like(g, SUBNORMAL))
    cpu = json.loads(run_cli("validate", src, "--target", "sglang", "--act-dtype", "float16", "--json", "-q",
                             check=False).stdout)
    assert any(f["check"] == "nvfp4.global.range" and f["severity"] == "warning" and f["expert"] == 0
               for f in cpu["findings"])
    source = kernel(src, PROVIDER, "--target", "sglang", "--act-dtype", "float16", check_rc=0)
    out = _convert(src, fmt, "sglang", "float16", tmp_path / "out")
    against = kernel(out, PROVIDER, "--against", src, check_rc=0)
    for name, data in (("source", source), ("against", against)):
        (f,) = [f for f in data["findings"] if f["check"] == "kernel.gemm"]
        assert f["severity"] == "warning" and f["cause"] == "nvfp4.global.range" and f["expert"] == 0, f
        assert f["value"] > KERNEL_REL_ERROR_MAX["float16"] and "the engine's own rounding" in f["message"]
        assert status(data, "kernel.gemm") == "warn"
        record(subnormal_global=name, rel_error=f["value"], message=f["message"])
    # an error beyond what the rounding explains stays an error: the stored global 2% off
    mg = _projection(out, 0, Role.DOWN).marlin_global.name
    edit(out, mg, lambda g: g * 1.02)
    broken = kernel(out, PROVIDER, "--against", src, "--no-verify-manifest", check_rc=1)
    (f,) = [f for f in broken["findings"] if f["check"] == "kernel.gemm"]
    assert f["severity"] == "error" and f["expert"] == 0 and "does not explain it" in f["message"]
    record(subnormal_global="global 2% off", rel_error=f["value"])


# ------------------------------------------------------------------ defective sources: findings, never a crash
@pytest.mark.parametrize("defect", ["nan-global", "missing-shard", "truncated-shard"])
def test_defective_sources_give_findings_never_a_crash(tmp_path, defect):
    src = tmp_path / "src"
    run_cli("synth", src, "--layers", "1", "--experts", "4", "--defect", defect)
    data = kernel(src, PROVIDER, "--target", TARGETS[0], check_rc=1)  # exit 1 with the report: never 2, 139, a traceback
    if defect == "nan-global":  # the engine would multiply by NaN: that expert cannot pass
        assert status(data, "kernel.gemm") == "fail"
    else:
        assert any("kernel checks skipped" in n for n in data["summary"]["notes"]) or data["kernel"]
    record(defect=defect, kernel_gemm=status(data, "kernel.gemm"), notes=data["summary"]["notes"])
