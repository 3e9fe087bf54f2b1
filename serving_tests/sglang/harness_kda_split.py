"""The one difference SGLang 0.5.23 itself makes between a GLM-5.3-Flash source and its conversion: which KDA
modules it builds. Glm5NextLinearAttention fuses the six KDA input projections into `fused_qkvbfg_a_proj` and
`f_b_proj` / `g_b_proj` into `fused_fg_b_proj` only when the model's quantisation config is named in its list
(glm5_next.py `_can_fuse_proj`: fp8, mxfp8, modelopt_fp8, modelopt_fp4, modelopt_mixed, quark) and leaves those
layers unquantised; for any other name (compressed-tensors, LoRA, the plugin's `marlin_fp4`) it builds `qkv_proj`
(q | k | v), `b_proj`, `f_a_proj`, `g_a_proj`, `f_b_proj`, `g_b_proj` and runs its unfused path (forward_qkvbfg
without the fusion). The plugin cannot take a name from that list. For the differential proof the engine's fused
tensors are split at SGLang's own shard sizes into the unfused modules' names, so every byte of the KDA layers is
still compared (a wrong split fails the comparison); every other tensor is compared as the engine made it."""

from __future__ import annotations

import torch

__all__ = ["kda_fused_as_unfused"]


def kda_fused_as_unfused(state: dict[str, torch.Tensor], plugin: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the engine's model) with each KDA layer that the plugin's model holds unfused split as the plugin's:
    `fused_qkvbfg_a_proj` rows [q | k | v | b | f_a | g_a] (MergedColumnParallelRepeatedLinear, TP 1) and
    `fused_fg_b_proj` [2, P, head_dim] (ColumnParallelBatchedLinear: f_b, g_b)."""
    out = dict(state)
    for name in state:
        if not name.endswith(".fused_qkvbfg_a_proj.weight"):
            continue
        base = name.removesuffix("fused_qkvbfg_a_proj.weight")
        if base + "qkv_proj.weight" not in plugin:
            continue
        sizes = [plugin[base + n + ".weight"].shape[0] for n in ("qkv_proj", "b_proj", "f_a_proj", "g_a_proj")]
        fused = out.pop(name)
        assert fused.shape[0] == sum(sizes), (name, fused.shape, sizes)
        for part, piece in zip(("qkv_proj", "b_proj", "f_a_proj", "g_a_proj"), torch.split(fused, sizes)):
            out[f"{base}{part}.weight"] = piece.contiguous()
        fg = out.pop(base + "fused_fg_b_proj.weight")
        out[f"{base}f_b_proj.weight"], out[f"{base}g_b_proj.weight"] = fg[0].contiguous(), fg[1].contiguous()
    return out
