"""Issue 37 item 7: one tile rule for gated and non-gated experts (formats/tiles.py moe_rank_tiles, `gated`), from
the engine table (core/targets/engines.py: SGLang 0.5.23 pads a non-gated NVFP4 I per rank to a multiple of 128 in
`prepare_moe_nvfp4_layer_for_marlin`, `if not layer.moe_runner_config.is_gated`; a gated one never), used by
plan, --tp/--ep, validate and the kernel runner (core/checkpoint/tensor_model.py MoeLayer.gated is the one home of
"gated"). Non-gated experts (Nemotron-H, ReLU-squared) were judged with w13 N = 2 x I_shard and refused as
"gated". Real CLI command lines on synth's Nemotron-H replicas; that SGLang's own load of the source equals
the plugin's load of the padded conversion is serving_tests/test_differential.py's `nemotron-h-...-i96` case.
Substitution: the command lines run in one CLI process, in order (run_cli_batch: `main(argv)` each, as the console
script runs it, its exit code, stdout and stderr), not one process each: a process start costs more than they do."""

from __future__ import annotations

import json

import pytest

from dsv4_convert.core.checkpoint.tensor_model import Role, gated_experts
from dsv4_convert.core.targets.engines import engine_facts
from dsv4_convert.formats.tiles import IMPOSSIBLE, OK, PAD, moe_rank_tiles
from tests.helpers.cli import run_cli_batch, succeeded

SGLANG = engine_facts("sglang").padding
NANO = {"hidden": 2688, "intermediate": 1856}  # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B config.json


def _roundup(x: int, m: int) -> int:
    return -(-x // m) * m


@pytest.mark.parametrize("tp, status, i_pad", [(1, OK, 1856), (2, PAD, 1024), (4, PAD, 512)])
def test_nemotron_3_nano_sizes_on_sglang(tp, status, i_pad):
    """I_shard = 1856 / TP; SGLang pads a non-gated I_shard to a multiple of 128 (its prepare code's
    `((intermediate_size + 127) // 128) * 128`). At TP 1 the kernel takes 1856 unpadded (w13 N = 1856 % 64 == 0)
    and SGLang's loader zero-fills the plugin's 1920 buffer: ok, layout-agnostic."""
    v = moe_rank_tiles("nvfp4", SGLANG, **NANO, tp=tp, gated=False)
    assert (v.status, v.i_shard) == (status, 1856 // tp)
    assert v.i_pad == i_pad == (1856 // tp if status == OK else _roundup(1856 // tp, 128))
    assert v.w13_nk == (v.i_pad, 2688)  # up alone
    if status == PAD:
        assert "non-gated" in v.reason


def test_refusals_say_gated_or_non_gated():
    gated = moe_rank_tiles("nvfp4", SGLANG, **NANO, tp=2)
    assert gated.status == IMPOSSIBLE and "does not pad a gated nvfp4 MoE" in gated.reason
    assert "w13 N=2*I_shard=96" in moe_rank_tiles("nvfp4", SGLANG, hidden=2688, intermediate=48, tp=1).reason
    odd_h = moe_rank_tiles("nvfp4", SGLANG, hidden=200, intermediate=256, tp=1, gated=False)
    assert odd_h.status == IMPOSSIBLE and "non-gated nvfp4 MoE" in odd_h.reason and "w13 N=I_shard=" in odd_h.reason


def test_gated_is_decided_by_the_roles():
    assert gated_experts([Role.GATE, Role.UP, Role.DOWN]) and not gated_experts([Role.GATE, Role.DOWN])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, step) -> the CLI's answer, and "dir": both tests' command lines in one CLI process, in order."""
    d = tmp_path_factory.mktemp("non-gated")
    nano, src, out = d / "nano", d / "src", d / "out"
    steps = {("nano", "synth"): ["synth", nano, "--family", "nemotron-h", "--hidden", 2688, "--intermediate", 1856,
                                 "--layers", 1, "--experts", 2, "-q"],
             ("nano", "plan"): ["plan", nano, "--gpus", 2, "--target", "sglang", "--json"],
             ("nano", "dry"): ["nvfp4-to-marlin", nano, d / "dry", "--target", "sglang", "--tp", 2, "--dry-run", "-q"],
             ("i96", "synth"): ["synth", src, "--family", "nemotron-h", "--intermediate", 96, "-q"],
             ("i96", "convert"): ["nvfp4-to-marlin", src, out, "--target", "sglang", "--tp", 1, "--workers", 1, "-q"],
             ("i96", "validate"): ["validate", out, "--against", src, "-q", "--gemm-experts", 0],
             ("i96", "reverse"): ["marlin-to-source", out, d / "back", "-q"]}
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), d))), "dir": d}



@pytest.mark.slow
def test_real_nano_sizes_at_sglang_tp2_are_planned_and_converted(runs):
    succeeded(runs["nano", "synth"])
    report = json.loads(succeeded(runs["nano", "plan"]).stdout)
    tp2 = next(c for c in report["candidates"] if (c["tp"], c["ep"]) == (2, 1))
    assert tp2["valid"] and tp2["tiles"] == "pad" and tp2["padded"]["i_shard"] == 1024, tp2
    assert "w13 [N=I/TP, K=H]" in " ".join(report["reasoning"])
    succeeded(runs["nano", "dry"])


@pytest.mark.slow
def test_non_gated_i96_converts_for_sglang_tp1_padded_and_validates(runs):
    """Was exit 4 convert.layout_impossible ("sglang does not pad a gated nvfp4 MoE")."""
    out = runs["dir"] / "out"
    succeeded(runs["i96", "synth"])
    succeeded(runs["i96", "convert"])
    layout = json.loads((out / "config.json").read_text())["quantization_config"]["tp_layout"]
    assert (layout["tp"], layout["ep"]) == (1, 1) and layout["containers"]
    for c in layout["containers"].values():
        assert (c["status"], c["i_shard"], c["i_pad"], c["gated"]) == ("pad", 96, 128, False), c
    succeeded(runs["i96", "validate"])
    succeeded(runs["i96", "reverse"])
