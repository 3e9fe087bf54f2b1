"""The inputs checks receive: plain dataclasses over tensors, built by the runner (or by tests).

Everything a numeric check needs is derived once per projection from two small per-block tensors,
so no check touches the [N, K] weights element by element:
  `block_max_code` uint8 [N, G]  the largest E2M1 magnitude index (0..7) in each scale block;
  `block_absmax`   float32 [N, G] the largest |dequantized value| of each block, computed in fp32
                   exactly as dequantization would (so NaN / Inf / zero blocks show up here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ..formats.constants import E2M1_VALUES
from ..formats.e8m0 import e8m0_to_float
from ..tensor_model import Checkpoint, Projection, Quant, Role

__all__ = ["Options", "CheckpointInput", "ProjectionTensors", "ExpertTensors", "MarlinTensors", "GemmCase",
           "block_max_code"]

# byte -> the larger magnitude index (code & 7) of its two E2M1 nibbles
_MAX_NIBBLE = np.array([max(b & 7, (b >> 4) & 7) for b in range(256)], dtype=np.uint8)
_E2M1_MAGNITUDES = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32)


@dataclass(frozen=True, slots=True)
class Options:
    """What the checkpoint will be served with (`engine`/`act_dtype`/`w4a8`: for a converted
    checkpoint, what it was converted for) and how much to check."""
    engine: str = "sglang"
    act_dtype: str = "bfloat16"
    w4a8: bool = False
    tp: int = 1
    ep: int = 1
    sample: float = 1.0
    gemm_experts: int = 2  # sampled experts per layer for the GEMM spot check
    seed: int = 0
    engine_requested: str | None = None  # what the user passed (--target / --act-dtype), if anything
    act_dtype_requested: str | None = None


@dataclass(frozen=True)
class HeaderInfo:
    """One shard as the validator's own header scan saw it (validate/headers.py)."""
    file: str
    size: int
    tensors: dict  # name -> (dtype, shape, begin, end) with absolute offsets
    error: str | None = None


@dataclass(frozen=True)
class CheckpointInput:
    """Checkpoint-level facts: the reader's model (None when it refused the checkpoint), the raw
    index and headers, and the options."""
    root: str
    options: Options
    checkpoint: Checkpoint | None
    index: dict | None  # parsed model.safetensors.index.json, or None
    index_error: str | None
    headers: dict[str, HeaderInfo]  # shard file -> header
    files_on_disk: tuple[str, ...]  # *.safetensors present in the directory
    config: dict = field(default_factory=dict)
    hf_quant_config: dict | None = None
    reader_error: object | None = None  # the DsvError the reader raised, if any


def block_max_code(weight: torch.Tensor, group: int) -> torch.Tensor:
    """packed uint8 [..., N, K/2] -> uint8 [..., N, K/group]: largest magnitude index per block."""
    b = weight.contiguous().view(torch.uint8).numpy()
    m = _MAX_NIBBLE[b]
    m = m.reshape(*m.shape[:-1], m.shape[-1] // (group // 2), group // 2).max(axis=-1)
    return torch.from_numpy(m)


@dataclass
class ProjectionTensors:
    """One projection in source form: uint8 codes [N, K/2], block scales (NVFP4 float8_e4m3fn
    [N, K/16], MXFP4 uint8 E8M0 [N, K/32]), the ModelOpt global multiplier (NVFP4) and the vLLM
    rescale factor `sf` of the stack it belongs to (1 unless engine=vllm, NVFP4, bf16)."""
    proj: Projection
    weight: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None = None
    sf: float = 1.0
    file: str | None = None

    @property
    def quant(self) -> Quant:
        return self.proj.quant

    @property
    def scale_name(self) -> str:
        return self.proj.scale.name

    @cached_property
    def scale_bytes(self) -> torch.Tensor:
        return self.scale.contiguous().view(torch.uint8)

    @cached_property
    def block_max_code(self) -> torch.Tensor:
        return block_max_code(self.weight, self.proj.group_size)

    @cached_property
    def scale_values(self) -> torch.Tensor:
        """float32 block scales as the checkpoint means them (E8M0 0xFF -> NaN, 0 -> 2**-127)."""
        if self.quant is Quant.NVFP4:
            return self.scale_bytes.view(torch.float8_e4m3fn).float()
        return e8m0_to_float(self.scale_bytes)

    @cached_property
    def block_absmax(self) -> torch.Tensor:
        v = _E2M1_MAGNITUDES[self.block_max_code.long()] * self.scale_values.abs()
        if self.global_scale is not None:
            v = v * self.global_scale.float().abs().reshape(())
        return v


@dataclass
class ExpertTensors:
    layer: str
    expert: int
    projections: dict[Role, ProjectionTensors]


@dataclass
class MarlinTensors:
    """One converted projection as stored, what the target says, the same projection decoded back
    to source form (`decoded`), and the reference projection from `--against` (or None)."""
    proj: Projection
    qweight: torch.Tensor
    mscale: torch.Tensor
    mglobal: torch.Tensor | None  # processed global as stored (NVFP4)
    kept_global: torch.Tensor | None  # weight_scale_2 kept for reversibility (NVFP4)
    engine: str
    act_dtype: str
    w4a8: bool
    sf: float
    decoded: ProjectionTensors | None = None
    reference: ProjectionTensors | None = None
    file: str | None = None


@dataclass
class GemmCase:
    """One sampled projection: `source` (the reference, in source form) and the Marlin tensors the
    kernel will use, with `mglobal` already the value the engine applies (the gate's for up)."""
    source: ProjectionTensors
    qweight: torch.Tensor
    mscale: torch.Tensor
    mglobal: torch.Tensor | None
    engine: str
    act_dtype: str
    w4a8: bool
    sf: float
    rows: int = 16
    seed: int = 0
    file: str | None = None

    @cached_property
    def errors(self) -> tuple[float, float]:
        """(relative Frobenius error, max abs error) of x @ W_marlin.T against x @ W_source.T."""
        from .emulate import gemm_errors
        return gemm_errors(self)
