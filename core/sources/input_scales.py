"""NVFP4 activation (input) scales: ModelOpt `input_scale` (a multiplier) or compressed-tensors
`input_global_scale` (a divisor), one F32 scalar per expert projection (or per stack). The Marlin W4A16
path does not use them, so the converter keeps them as they are; but a NaN, infinite, zero or negative one is
a broken export that any W4A4/W4A8 path (or another engine) would turn into NaN or zero activations. Read
by both the converter (a warning) and validate (nvfp4.input_scale.invalid); a few bytes per projection."""

from __future__ import annotations

import numpy as np

from ..checkpoint.reader import TensorReader
from ..checkpoint.tensor_model import Checkpoint, TensorRef

__all__ = ["invalid_input_scales"]


def invalid_input_scales(ckpt: Checkpoint) -> list[tuple[TensorRef, float]]:
    """(tensor, first bad value) of every input scale that is not a finite value > 0, in projection order."""
    seen: set[str] = set()
    bad: list[tuple[TensorRef, float]] = []
    with TensorReader(ckpt.root) as reader:
        for p in ckpt.projections:
            ref = p.input_scale
            if ref is None or ref.name in seen or ref.dtype != "F32":  # a wrong dtype: structure / group errors
                continue
            seen.add(ref.name)
            v = np.asarray(reader.array(ref)).view(np.float32).reshape(-1)
            odd = v[~(np.isfinite(v) & (v > 0))]
            if odd.size:
                bad.append((ref, float(odd[0])))
    return bad
