"""The SERVING.md written into every converted checkpoint."""

from __future__ import annotations

from .plan import ConvertPlan

__all__ = ["serving_markdown"]


def serving_markdown(plan: ConvertPlan, out_name: str) -> str:
    t = plan.target
    engine_flag = ("--moe-runner-backend marlin" if t.engine == "sglang" else "--moe-backend marlin")
    launch = (f"python -m sglang.launch_server --model-path {out_name} --moe-runner-backend marlin --tp 8"
              if t.engine == "sglang" else f"vllm serve {out_name} --moe-backend marlin --tensor-parallel-size 8")
    return f"""# Serving this checkpoint on sm_120 (RTX PRO 6000, RTX 5090)

Converted by dsv4-convert from a `{plan.checkpoint.format.value}` checkpoint. The routed-expert weights
are already in Marlin tile order, layout **`{t.layout_tag}`** ({t.engine} {t.engine_version},
{t.act_dtype} activations{", W4A8" if t.w4a8 else ""}). Everything else is byte-identical to the input.

## Why Marlin, and why the flag
On sm_120 the datacenter MoE kernels (trtllm-gen, `flashinfer_trtllm_routed`) do not run: they are
built for SM100. Marlin (4-bit weights, 16-bit activations) is the tensor-core path that works.
Force it with `{engine_flag}`, so that the engine does not auto-select a backend that fails late.

## Launch
1. Install the plugin into the server's environment: `pip install dsv4-convert`. It registers the
   `marlin_fp4` quantization method through the engine's plugin entry point; no code change.
2. Start the server ({t.engine} only: the layout tag is checked at load and a mismatch is refused):

       {launch}

3. Check the log for the plugin's line (`dsv4-convert: marlin_fp4 plugin registered`) and that the
   engine does not print a Marlin repack step for the experts.

An engine without the plugin refuses this checkpoint (`quant_method: marlin_fp4` is unknown to it)
instead of repacking the packed bytes a second time. To get the original checkpoint back, run
`dsv4-convert marlin-to-source {out_name} ORIGINAL`.

## What `{t.layout_tag}` means
{"NVFP4 block scales are S0E5M3 bytes (x128, power-of-two rescale per stacked tensor in bf16, values below 2 clamped to 0) and the global is fp32." if t.engine == "vllm" else "NVFP4 block scales are S0E5M3 bytes (x128, no rescale, no clamp) and the global is stored in the activation dtype."}
MXFP4 scales are permuted E8M0 bytes. See the dsv4-convert docs (FORMAT.md) for the exact layout.
"""
