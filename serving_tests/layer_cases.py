"""The one-MoE-layer plugin tests' cases, shared by both engines (serving_tests/{sglang,vllm}/test_*_plugin.py
build them, their harness_*.py run them in each rank): a case is a dict of the harness's run_case arguments.
Engine-independent: synth.py's codecs and the converter's CLI."""

from __future__ import annotations

import synth
from dsv4_convert.core.targets.target import MarlinTarget

__all__ = ["EXPERTS", "FINAL", "HIDDEN", "INTER", "case_tensors", "layer_case", "with_checkpoints"]

EXPERTS, HIDDEN, INTER = 4, 256, 256  # per-rank I: 128 at TP=2 (MXFP4 needs 128, NVFP4 64), 256 at EP=2

# the expert parameters both engines' Marlin methods finally hold: compared byte for byte
FINAL = {
    "mxfp4": ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"],
    "nvfp4": ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2",
              "w2_weight_scale_2"],
}


def layer_case(case_id: str, fmt: str, act_dtype: str, *, ep: bool = False, **extra) -> dict:
    """One case: EXPERTS experts of HIDDEN x INTER unless `extra` says otherwise; `ep`: served with expert parallelism."""
    return {"id": case_id, "fmt": fmt, "act_dtype": act_dtype, "ep": ep, "experts": EXPERTS, "hidden": HIDDEN, "inter": INTER,
            **extra}


def with_checkpoints(cases: list[dict], tmp, engine: str) -> list[dict]:
    """The cases, each with the real converter's output for it (synth.make_checkpoints: source dir, converted
    dir), `--tp/--ep` for the split a case's `padded` names."""
    return [{**c, "checkpoints": list(synth.make_checkpoints(
        tmp, c["fmt"], engine=engine, act_dtype=c["act_dtype"], experts=c["experts"], hidden=c["hidden"],
        inter=c["inter"], **(c.get("padded") or {})))} for c in cases]


def case_tensors(fmt: str, engine: str, *, act_dtype: str, experts: int, hidden: int, inter: int, convert_for: str,
                 small_scales, padded: dict | None, checkpoints: list | None, w4a8: bool = False):
    """(source experts, converted experts, the converted quantization_config, the `--tp/--ep` layout or None) of
    one case: built by synth.py's codecs as `convert_for`'s converter writes them (`small_scales`: the experts
    given small block scales), padded for the split `padded` (which may differ from the one run), or read back
    from the real converter's `checkpoints`."""
    src = synth.source_experts(fmt, experts=experts, hidden=hidden, inter=inter, small_scales_for=tuple(small_scales))
    target = MarlinTarget(engine=convert_for, act_dtype=act_dtype, w4a8=w4a8)
    conv = None if padded else synth.converted_experts(src, fmt, target, experts=experts)
    qc = synth.quant_config(fmt, MarlinTarget(engine=engine, act_dtype=act_dtype, w4a8=w4a8),
                            rescale=synth.rescale_factors(src, target, range(experts)))
    layout = None
    if padded is not None:
        layout = synth.tp_layout(fmt, engine, hidden=hidden, inter=inter, experts=experts, **padded)
        conv = synth.padded_experts(src, fmt, target, layout, experts=experts)
        qc = {**qc, "tp_layout": layout, "layouts": [padded]}
    if checkpoints is not None:
        src, _ = synth.load_checkpoint_experts(checkpoints[0])
        conv, qc = synth.load_checkpoint_experts(checkpoints[1])
    return src, conv, qc, layout
