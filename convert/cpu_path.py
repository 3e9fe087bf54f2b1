"""The converter's default route for one projection: numpy and the compiled kernels, no torch.

Importing torch costs ~3 s of every run on the 2-core machine (a fifth of converting a 3.6 GB layer),
and a plain NVFP4 / MXFP4 projection needs none of it: read the bytes, repack the words
(formats/marlin/reference_weight.py), transpose + permute + re-encode the scales and process the global
(formats/marlin/reference_scales.py), write. This module does exactly that and answers None for everything
else, which then takes the torch route (convert/transform.py) with the same result: padded --tp
layouts, W4A8, globals not stored as float32, and the rare projections whose scales hold NaN (the
torch route raises the error) or a byte the target cannot hold exactly (it records the lost bytes for
the reverse). Both routes give the same bytes: the CLI tests run the two on every source format
(DSV4_CONVERT_TORCH_ROUTE=1 forces the torch route)."""

from __future__ import annotations

import numpy as np

from ..core.checkpoint.dtypes import SCALE_DTYPES, WEIGHT_DTYPES
from ..core.checkpoint.tensor_model import Projection, Quant
from ..core.sources.source_formats import SourceFormat
from ..formats.constants import E4M3_NAN_BYTES, E8M0_NAN
from ..formats.marlin.compiled_kernels import byte_presence
from ..formats.marlin.reference_scales import global_to_marlin, inexact_bytes, permute_scales, s0e5m3_table
from ..formats.marlin.reference_weight import a16_forward
from ..runtime.settings import TORCH_ROUTE_ENV, settings

__all__ = ["TORCH_ROUTE_ENV", "convert_on_cpu", "load_kernels"]

_NAN_BYTES = {Quant.NVFP4: list(E4M3_NAN_BYTES), Quant.MXFP4: [E8M0_NAN]}


def load_kernels() -> None:
    """Load the compiled kernels this route calls, through the calls it makes, on tiny inputs (the
    same argument types, so the same compiled versions). The first load in a process also sets
    numba's runtime up, about 1 s: a parent pays it once before it forks its workers, instead of
    every worker paying it (16 workers spent 16 CPU seconds on it on the 16-core machine)."""
    scale = np.zeros((1, 64, 2), np.uint8)
    byte_presence(scale.reshape(-1))
    permute_scales(scale)
    permute_scales(scale, table=s0e5m3_table(clamp=True))
    a16_forward(np.zeros(64 * 16, np.uint8), 64, 16, threads=1)


def _routable(p: Projection, target) -> bool:
    """Whether this module converts `p` (else the torch route does)."""
    if settings().torch_route:
        return False
    if target.w4a8 or p.marlin_global is not None:
        return False
    if p.weight.dtype not in WEIGHT_DTYPES or p.scale.dtype not in SCALE_DTYPES[p.quant.value]:
        return False
    return p.quant is Quant.MXFP4 or (p.global_scale is not None and p.global_scale.dtype == "F32")


def _rows(reader, ref, p: Projection) -> np.ndarray:
    """The projection's [N, bytes per row] slab of `ref`: the whole tensor, or for stacked sources
    (gpt-oss, Llama-4) expert `expert_index`'s rows `p.rows`, after the transpose of a K-major stack."""
    if p.expert_index is None:
        return reader.array(ref).reshape(p.n, -1)
    slab = reader.expert_array(ref, p.expert_index)
    slab = slab.reshape(ref.shape[1], -1).T if p.k_major else slab.reshape(-1, slab.size // ref.shape[1])
    return np.ascontiguousarray(slab[p.rows])


def convert_on_cpu(reader, p: Projection, fmt: SourceFormat, target, sf: float, *,
                   threads: int | None = None) -> dict[str, np.ndarray] | None:
    """One projection -> its output parts as numpy arrays (named as plan._projection_outputs names
    them), or None when the torch route must convert it (see the module docstring). The weight repack
    runs on `threads` CPU threads."""
    if not _routable(p, target):
        return None
    scale = _rows(reader, p.scale, p)
    present = byte_presence(scale.reshape(-1))  # one pass: the NaN and the exactness tests below
    if present[_NAN_BYTES[p.quant]].any():
        return None
    if p.quant is Quant.NVFP4 and (present & inexact_bytes(clamp=target.clamps_scales, sf=sf)).any():
        return None
    weight = _rows(reader, p.weight, p)
    n, k2 = weight.shape
    parts = {"weight": a16_forward(weight.reshape(-1), n, k2, threads=threads)}
    if p.quant is Quant.MXFP4:
        parts["weight_scale"] = permute_scales(scale.reshape(1, n, -1))
        return parts
    parts["weight_scale"] = permute_scales(scale.reshape(1, n, -1), table=s0e5m3_table(clamp=target.clamps_scales, sf=sf))
    g = reader.array(p.global_scale).view(np.float32)
    if fmt.global_rule.reciprocal:  # a divisor: the ModelOpt multiplier is 1 / max, in float32
        g = np.float32(1.0) / g.max()
    elif g.size != 1:
        return None
    g = np.asarray(g, dtype=np.float32).reshape(())
    if not (np.isfinite(g) and g > 0):
        return None  # the torch route raises the error
    parts["weight_global_scale"] = global_to_marlin(g, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
    parts["weight_scale_2"] = g
    return parts
