"""What a conversion targets: the engine's Marlin layout, the activation dtype, W4A8 or not. The codecs
(formats/) take one as a value and read its fields; they never import the engine table themselves."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..checkpoint.dtypes import ACT_DTYPE_NAMES
from ..checkpoint.tensor_model import Quant
from .engines import (
    ACT_DTYPES,
    DEFAULT_ENGINE,
    ENGINES,
    EngineFacts,
    engine_facts,
    mxfp4_dtype_problem,
)

__all__ = ["MarlinTarget"]


@dataclass(frozen=True, slots=True)
class MarlinTarget:
    engine: str = DEFAULT_ENGINE
    act_dtype: str = "bfloat16"
    w4a8: bool = False

    def __post_init__(self):
        engine_facts(self.engine)  # raises for an unknown engine
        if self.act_dtype not in ACT_DTYPES:
            raise ValueError(f"unknown activation dtype {self.act_dtype!r}; choose one of {ACT_DTYPES}")
        if self.w4a8 and not ENGINES[self.engine].w4a8:
            w4a8 = [f.name for f in ENGINES.values() if f.w4a8]
            raise ValueError(f"W4A8 (fp8 activations) Marlin exists only in "
                             f"{'; '.join(ENGINES[n].w4a8_versions() for n in w4a8) or 'no engine'}; "
                             f"use engine={' or '.join(map(repr, w4a8))}, or convert without W4A8")

    def for_quant(self, quant: Quant | None) -> MarlinTarget:
        """This target as it applies to a projection of `quant`: W4A8 Marlin exists for MXFP4 only, so an
        NVFP4 projection of a W4A8 target is read in the 16-bit-activation layout (validate reads such a
        checkpoint; the converter refuses to write one: convert.w4a8_nvfp4)."""
        return self if not self.w4a8 or quant is Quant.MXFP4 else replace(self, w4a8=False)

    @property
    def facts(self) -> EngineFacts:
        return ENGINES[self.engine]

    @property
    def clamps_scales(self) -> bool:
        """NVFP4 block scales the target cannot hold become 0 (else |s|): the codecs' `clamp`."""
        return ENGINES[self.engine].scale_clamp

    @property
    def rescales(self) -> bool:
        """Whether NVFP4 block scales get a per-stack rescale factor (needs a planning pass over them)."""
        return ENGINES[self.engine].rescale and self.act_dtype == "bfloat16"

    @property
    def fp32_global(self) -> bool:
        """The processed NVFP4 global is float32 (else the activation dtype): the codecs' `fp32_global`."""
        return ENGINES[self.engine].fp32_global

    @property
    def global_dtype(self) -> str:
        """safetensors dtype of the processed NVFP4 global this target writes."""
        return "F32" if self.fp32_global else ACT_DTYPE_NAMES[self.act_dtype]

    @property
    def layout_tag(self) -> str:
        return ENGINES[self.engine].layout_tag

    @property
    def engine_version(self) -> str:
        return ENGINES[self.engine].version

    @property
    def mxfp4_problem(self) -> str | None:
        """Why MXFP4 experts cannot be served with this target's activations, or None."""
        return mxfp4_dtype_problem(self.act_dtype)
