"""The SERVING.md written into every converted checkpoint: what to install, which flags, and how to
check that the plugin took over (facts from dsv4_convert.serving.config, which imports no engine)."""

from __future__ import annotations

from ..core.checkpoint.tensor_model import Quant
from ..core.sources.mtp import copied_mtp_layers
from ..core.sources.side_tables import engram_table_bytes
from ..core.targets.engines import ENGINES, QUANT_METHOD, launch_command, registration_log_line, shell_quote
from ..core.targets.parallel_rules import split_dims, split_refusals
from ..core.version import install_sentence
from .plan import ConvertPlan

__all__ = ["serving_markdown"]


def _w4a8_note(t) -> str:
    if not t.w4a8:
        return ""
    return (f"\n**W4A8 (fp8 activations): only {t.facts.w4a8_versions()} serves this checkpoint** (the engine "
            "table, core/targets/engines.py). Later releases removed W4A8 Marlin and the plugin refuses the checkpoint "
            "there before loading anything; to serve on them, convert the source again without `--w4a8`.\n")


def serving_markdown(plan: ConvertPlan, out_name: str) -> str:
    t = plan.target
    dims = split_dims(plan.checkpoint.config, t.engine)  # the engine's TP rules (heads, ...): core/targets/parallel_rules.py
    refused = {te: why for te in plan.layouts if (why := split_refusals(dims, te[0]))}
    layouts = [te for te in plan.layouts if te not in refused]
    tp, ep = plan.tp_layout or max(layouts, key=lambda te: (te[0], -te[1]), default=(1, 1))
    nvfp4 = any(p.quant is Quant.NVFP4 for p in plan.projections)
    flag = ENGINES[t.engine].moe_backend_flag
    launch = launch_command(t.engine, out_name, tp=tp, ep=ep, act_dtype=t.act_dtype)
    rules = ["x128", "a power-of-two rescale per stacked tensor in bf16" if t.facts.rescale else "no rescale",
             "values below 2 clamped to 0" if t.clamps_scales else "no clamp"]
    scales = (f"S0E5M3 bytes ({', '.join(rules)}) with "
              + ("an fp32 global" if t.fp32_global else "the global in the activation dtype"))
    return f"""# Serving this checkpoint on sm_120 (RTX PRO 6000, RTX 5090)

Converted by dsv4-convert from a `{plan.checkpoint.format.value}` checkpoint. The routed-expert weights
are already in Marlin tile order, layout **`{t.layout_tag}`** ({t.engine} {t.engine_version},
{t.act_dtype} activations{", W4A8" if t.w4a8 else ""}). Everything else is byte-identical to the input.
{_w4a8_note(t)}
## Why Marlin, and why the flag
On sm_120 the datacenter MoE kernels (trtllm-gen, `flashinfer_trtllm_routed`) do not run: they are
built for SM100. Marlin (4-bit weights, 16-bit activations) is the tensor-core path that works.
Force it with `{flag}`, so that the engine does not auto-select a backend that fails late.

## Launch
1. Install the plugin into the server's environment: {install_sentence()}. It registers the
   `{QUANT_METHOD}` quantization method through the engine's plugin entry point. Pass no
   `--quantization` flag: the engine reads `quant_method: {QUANT_METHOD}` from config.json.
2. Start {t.engine} in the folder that holds this checkpoint's folder (elsewhere, give its absolute path;
   the layout tag is checked at load; a checkpoint for the other engine is refused):

       {launch}

   {_splits(plan, layouts)}{_refused(t.engine, refused)}
   {"The activation dtype must be the one converted for (NVFP4 bytes depend on it)." if nvfp4 else ""}
3. Check the log for the plugin's line, and that no Marlin repack of the experts is logged:

       {registration_log_line(t.engine, t.engine_version)}

An engine without the plugin refuses this checkpoint (`{QUANT_METHOD}` is unknown to it) instead of
repacking the packed bytes a second time. To get the original checkpoint back, run
`dsv4-convert marlin-to-source {shell_quote(out_name)} ORIGINAL`.

{_mtp(plan)}{_engram(plan, launch)}## What `{t.layout_tag}` means
NVFP4 block scales are {scales}. MXFP4 scales are permuted E8M0 bytes. The exact layout is in
dsv4-convert's docs/FORMAT.md.
"""


def _splits(plan: ConvertPlan, layouts: list[tuple[int, int]]) -> str:
    listed = ", ".join(f"TP {a} / EP {b}" for a, b in layouts)
    if not plan.padded:
        fixed = (f"Converted with `--tp {plan.tp_layout[0]} --ep {plan.tp_layout[1]}` (quantization_config.tp_layout); "
                 "these shapes need no padding, so the bytes are layout-agnostic.\n   ") if plan.tp_layout else ""
        return (f"{fixed}Splits that keep whole Marlin tiles per rank for this model (recorded in "
                "quantization_config.layouts;\n   the engine would pad any other, and the plugin refuses it): "
                f"{listed}.")
    tp, ep = plan.tp_layout
    groups: dict[str, int] = {}
    for v in plan.rank_tiles.values():
        if v.status == "pad":
            what = [f"I_shard {v.i_shard} -> {v.i_pad}"] * (v.i_pad != v.i_shard) + [f"H {v.hidden} -> {v.h_pad}"] * (
                v.h_pad != v.hidden)
            groups[", ".join(what)] = groups.get(", ".join(what), 0) + 1
    sizes = "; ".join(f"{n} experts layer{'s' * (n > 1)}: {what}" for what, n in groups.items())
    return (f"This checkpoint serves **TP {tp} / EP {ep} only**: it was converted with `--tp {tp} --ep {ep}`, and "
            f"the experts\n   are written padded per rank exactly as {plan.target.engine} pads them "
            f"(quantization_config.tp_layout; {sizes}).\n   The plugin refuses any other --tp/--ep; for another "
            "split, convert the source again with that --tp/--ep.")


def _refused(engine: str, refused: dict) -> str:
    if not refused:
        return ""
    first = next(iter(refused.values()))
    return (f"\n   {engine} refuses {', '.join(f'TP {t} / EP {e}' for t, e in refused)} for this model at launch "
            f"({'; '.join(first)}), whatever the experts allow.")


def _mtp(plan: ConvertPlan) -> str:
    """A paragraph for the MTP (draft) layers this conversion copied as the source holds them (core/sources/mtp.py:
    DeepSeek-R1 / V3 `model.layers.<N>`, Qwen3.5 / Qwen3-Next `mtp.*`, BF16 in the releases)."""
    copied = copied_mtp_layers(plan.checkpoint.tensors, plan.checkpoint.config, plan.checkpoint.projection_names)
    if not copied:
        return ""
    layers = ", ".join(f"`{layer}` ({n} tensors)" for layer, n in copied.items())
    return (f"## The MTP (draft) layers\n{layers}: copied byte for byte, as the source holds them (no FP4 experts "
            "to convert; the releases keep them BF16 and exclude them from their quantisation). The main model "
            f"does not load them. An engine's draft model (speculative decoding) asks {QUANT_METHOD} for their "
            "methods, which gives them the source's own non-expert config; docs/SERVING.md says which engine "
            "release is proven to load that draft.\n\n")


def _engram(plan: ConvertPlan, launch: str) -> str:
    """A paragraph for DeepSeek-V4.1's Engram tables (core/sources/side_tables.py): copied, and where the engine keeps them
    (core/targets/engines.py EngramHost), with the launch that puts them in the other place."""
    size = engram_table_bytes(plan.checkpoint.tensors)
    facts = ENGINES[plan.target.engine].engram
    if not size or facts is None:
        return ""
    here = "in pinned host memory" if facts.default_on_host else "on the GPUs, sharded over TP"
    other = facts.on_gpu if facts.default_on_host else facts.on_host
    return (f"## The Engram tables\n{size / (1 << 30):.1f} GiB of Engram tables (`layers.L.engram.embed.*`), copied "
            f"byte for byte. {plan.target.engine} keeps them {here} by default; the other placement:\n\n"
            f"       {other.format(cmd=launch)}\n\n`dsv4-convert plan` says which placement fits your GPUs.\n\n")
