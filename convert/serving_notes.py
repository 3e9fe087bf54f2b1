"""The SERVING.md written into every converted checkpoint: what to install, which flags, and how to
check that the plugin took over (facts from dsv4_convert.serving.config, which imports no engine)."""

from __future__ import annotations

from dsv4_convert.core.tensor_model import Quant, Role
from dsv4_convert.plan import ConvertPlan
from dsv4_convert.serving.config import registration_log_line, working_tp_sizes

__all__ = ["serving_markdown"]


def _tp_sizes(plan: ConvertPlan) -> list[int]:
    """TP sizes (up to 16) whose per-rank expert shapes the engine does not pad."""
    gate = next((p for p in plan.projections if p.role is Role.GATE and not p.layer.startswith("mtp")), None)
    if gate is None:
        return list(range(1, 17))
    return [tp for tp in working_tp_sizes(gate.quant.value, plan.target.engine, intermediate=gate.n,
                                          hidden=gate.k) if tp <= 16]


def serving_markdown(plan: ConvertPlan, out_name: str) -> str:
    t = plan.target
    sizes = _tp_sizes(plan)
    tp = max([s for s in sizes if s <= 8], default=1)
    nvfp4 = any(p.quant is Quant.NVFP4 for p in plan.projections)
    dtype = f" --dtype {t.act_dtype}" if nvfp4 else ""
    if t.engine == "sglang":
        flag = "--moe-runner-backend marlin"
        launch = f"python -m sglang.launch_server --model-path {out_name} --tp {tp} {flag}{dtype}"
    else:
        flag = "--moe-backend marlin"
        launch = f"vllm serve {out_name} --tensor-parallel-size {tp} {flag}{dtype}"
    scales = ("S0E5M3 bytes (x128, a power-of-two rescale per stacked tensor in bf16, values below 2 "
              "clamped to 0) with an fp32 global" if t.engine == "vllm" else
              "S0E5M3 bytes (x128, no rescale, no clamp) with the global in the activation dtype")
    return f"""# Serving this checkpoint on sm_120 (RTX PRO 6000, RTX 5090)

Converted by dsv4-convert from a `{plan.checkpoint.format.value}` checkpoint. The routed-expert weights
are already in Marlin tile order, layout **`{t.layout_tag}`** ({t.engine} {t.engine_version},
{t.act_dtype} activations{", W4A8" if t.w4a8 else ""}). Everything else is byte-identical to the input.

## Why Marlin, and why the flag
On sm_120 the datacenter MoE kernels (trtllm-gen, `flashinfer_trtllm_routed`) do not run: they are
built for SM100. Marlin (4-bit weights, 16-bit activations) is the tensor-core path that works.
Force it with `{flag}`, so that the engine does not auto-select a backend that fails late.

## Launch
1. Install the plugin into the server's environment: `pip install dsv4-convert`. It registers the
   `marlin_fp4` quantization method through the engine's plugin entry point. Pass no
   `--quantization` flag: the engine reads `quant_method: marlin_fp4` from config.json.
2. Start {t.engine} (the layout tag is checked at load; a checkpoint for the other engine is refused):

       {launch}

   Tensor-parallel sizes that keep whole Marlin tiles per rank for this model: {", ".join(map(str, sizes)) or
   "none (the engine would pad every split: serve the source instead)"}.
   {"The activation dtype must be the one converted for (NVFP4 bytes depend on it)." if nvfp4 else ""}
3. Check the log for the plugin's line, and that no Marlin repack of the experts is logged:

       {registration_log_line(t.engine, t.engine_version)}

An engine without the plugin refuses this checkpoint (`marlin_fp4` is unknown to it) instead of
repacking the packed bytes a second time. To get the original checkpoint back, run
`dsv4-convert marlin-to-source {out_name} ORIGINAL`.

## What `{t.layout_tag}` means
NVFP4 block scales are {scales}. MXFP4 scales are permuted E8M0 bytes. The exact layout is in
dsv4-convert's docs/FORMAT.md.
"""
