"""The one documented difference of the vLLM plugin's gpt-oss experts (serving/vllm_gpt_oss.py): vLLM's
own w13 rows are interleaved (g0, u0, g1, u1, ...), the plugin's are [gates; ups] run with
SWIGLUOAI_UNINTERLEAVE. For the differential proof the engine's final w13 tensors are taken to the
plugin's row order: the Marlin weight and scale through the project's inverse codec, the rows permuted,
and the forward codec (both pinned to vLLM's bytes by the golden cases); the bias through vLLM's own
`marlin_permute_bias`. Every other tensor is compared as the engine made it."""

from __future__ import annotations

import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import marlin_to_mxfp4, mxfp4_to_marlin

__all__ = ["engine_rows_as_plugin"]


def _unpermute_bias(b: torch.Tensor) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias

    idx = marlin_permute_bias(torch.arange(b.shape[-1], dtype=torch.float32)).long()
    out = torch.empty_like(b)
    out[..., idx] = b
    return out


def engine_rows_as_plugin(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the engine's model) with every gpt-oss w13 weight, scale and bias in [gates; ups] order."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias

    target = MarlinTarget(engine="vllm")
    out = dict(state)
    for name in state:
        if not name.endswith(".w13_weight"):
            continue
        base = name.removesuffix("w13_weight")
        q, s, bias = state[name], state[base + "w13_weight_scale"], state[base + "w13_bias"]
        n, k = q.shape[2] // 2, q.shape[1] * 16  # [E, H/16, 2 * (2 I_p)]: N = 2 I_p rows, K = H
        perm = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])
        weight, scale = marlin_to_mxfp4(q, s, target=target, n=n, k=k)
        q2, s2 = mxfp4_to_marlin(weight[:, perm], scale[:, perm], target=target)
        out[name], out[base + "w13_weight_scale"] = q2, s2.view(s.dtype)
        out[base + "w13_bias"] = torch.stack([marlin_permute_bias(b) for b in _unpermute_bias(bias)[:, perm]])
    return out
