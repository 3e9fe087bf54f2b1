"""vLLM's bf16 rescale factor of every stacked expert tensor of a checkpoint, read from its scales.

The one routine both the converter's planning pass and the validator run, so that what validate
checks is what the converter wrote. Keys are `container.stack` (`layers.0.ffn.experts.w13`), the
form `quantization_config.rescale_factors` records."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...formats.marlin.compiled_kernels import byte_presence
from ...formats.marlin.reference_scales import rescale_factor
from ..checkpoint.tensor_model import Projection, Quant
from ..errors import DsvError

__all__ = ["stack_key", "stack_rescale_factors"]


def stack_key(p: Projection) -> str:
    return f"{p.container}.{p.stack}"


def stack_rescale_factors(reader, projections: Iterable[Projection], act_dtype: str, *,
                          skip_unreadable: bool = False) -> dict[str, float]:
    """`container.stack` -> vLLM's rescale factor (formats/marlin/reference_scales.rescale_factor) over all NVFP4
    experts of that stack, reading one scale tensor at a time. With `skip_unreadable` (the validator,
    whose structure checks report them) a scale that cannot be read is left out instead of raising."""
    stacks: dict[str, list[Projection]] = {}
    for p in projections:
        if p.quant is Quant.NVFP4:
            stacks.setdefault(stack_key(p), []).append(p)
    return {key: rescale_factor(_present(reader, members, skip_unreadable), act_dtype)
            for key, members in stacks.items()}


def _present(reader, members: list[Projection], skip_unreadable: bool) -> np.ndarray:
    """Which E4M3 byte values occur in the members' scales (all the factor depends on), one scale
    tensor read at a time."""
    present = np.zeros(256, dtype=bool)
    for p in members:
        try:
            present |= byte_presence(reader.array(p.scale))
        except DsvError:
            if not skip_unreadable:
                raise
    return present
