"""The inputs checks receive: plain dataclasses over tensors, built by the runner (or by tests).

Everything a numeric check needs is derived once per projection from small per-block arrays, so no
check touches the [N, K] weights element by element:
  `block_nonzero`  bool [N, G]: the block has a non-zero code. One NVFP4 block (16 codes) is exactly
                   one 64-bit word and an MXFP4 block two, so this is one AND per 8 bytes;
  `nonfinite_blocks` / `zero_blocks` bool [N, G]: blocks that dequantize (in fp32) to NaN/Inf, or to
                   all zeros, decided from the scale bytes, the global and `block_nonzero`; only when
                   a scale is large enough to overflow is the per-block maximum code looked at;
  `block_absmax`   float32 [N, G]: the largest |dequantized value| per block (reference, for tests).
Byte masks use numpy: on small uint8 arrays it is 10-100x faster than torch's threaded kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ..core.checkpoint.tensor_model import Checkpoint, Projection, Quant, Role
from ..core.targets.target import MarlinTarget
from ..formats.constants import E2M1_MAX, E2M1_VALUES, E4M3_MAX, E8M0_NAN
from ..formats.e4m3 import e4m3_is_nan
from ..formats.e8m0 import e8m0_to_float
from ..formats.tiles import RankTiles

__all__ = [
    "CheckpointInput",
    "Coverage",
    "ExpertTensors",
    "GemmCase",
    "MarlinTensors",
    "Options",
    "ProjectionTensors",
    "block_max_code",
]

# byte -> the larger magnitude index (code & 7) of its two E2M1 nibbles
_MAX_NIBBLE = np.array([max(b & 7, (b >> 4) & 7) for b in range(256)], dtype=np.uint8)
_E2M1_MAGNITUDES = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32)
_MAGNITUDE_BITS = np.uint64(0x7777777777777777)  # every nibble without its sign bit
_FP32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, slots=True)
class Options:
    """What the checkpoint will be served with (`target`, the converter's target object: for a converted
    checkpoint, what it was converted for) and how much to check."""
    target: MarlinTarget = MarlinTarget()
    tp: int = 1
    ep: int = 1
    sample: float = 1.0
    gemm_experts: int = 2  # sampled experts per layer for the GEMM spot check
    seed: int = 0
    engine_requested: str | None = None  # what the user passed (--target / --act-dtype), if anything
    act_dtype_requested: str | None = None
    verify_manifest: bool = True  # re-hash every file a converted checkpoint's manifest lists
    layout_requested: bool = False  # --tp/--ep given (else a converted checkpoint's tp_layout is the default)


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
    against: Checkpoint | None = None  # the --against reference (set once it has been opened)


@dataclass(frozen=True)
class Coverage:
    """What a whole run found and checked (the RUN-scope checks read it after every other check)."""
    found: int  # FP4 expert projections the reader found
    checked: int  # projections read, decoded and checked
    experts: int  # experts checked (after --sample)
    against: bool  # --against given
    compared: int  # projections compared with their --against counterpart
    format: str


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
    def scale_np(self) -> np.ndarray:
        return self.scale_bytes.numpy()

    @cached_property
    def block_max_code(self) -> torch.Tensor:
        return block_max_code(self.weight, self.proj.group_size)

    @cached_property
    def block_nonzero(self) -> np.ndarray:
        w = self.weight.contiguous().view(torch.uint8).numpy()
        words = w.reshape(w.shape[0], -1).view("<u8") & _MAGNITUDE_BITS
        if self.proj.group_size == 32:
            words = words.reshape(words.shape[0], -1, 2)
            words = words[..., 0] | words[..., 1]
        return words != 0

    @cached_property
    def global_value(self) -> float | None:
        if self.global_scale is None or self.global_scale.numel() == 0:
            return None
        return float(self.global_scale.float().reshape(-1)[0])

    @cached_property
    def nonfinite_blocks(self) -> np.ndarray:
        b = self.scale_np
        if self.quant is Quant.NVFP4:
            g = self.global_value
            if g is not None and not math.isfinite(g):
                return np.ones(b.shape, dtype=bool)
            mask = e4m3_is_nan(b)
            if g is not None and abs(g) * E4M3_MAX * E2M1_MAX > _FP32_MAX:
                mask = mask | ~torch.isfinite(self.block_absmax).numpy()
            return mask
        mask = b == E8M0_NAN
        if (b[~mask] >= 253).any() if mask.any() else (b >= 253).any():
            code = self.block_max_code.numpy()  # 2**126 * 4 and 2**127 * 2 overflow fp32
            mask = mask | ((b == 254) & (code >= 4)) | ((b == 253) & (code >= 6))
        return mask

    @cached_property
    def zero_blocks(self) -> np.ndarray:
        zero = ~self.block_nonzero
        if self.quant is Quant.NVFP4:
            g = self.global_value
            if g == 0:
                return np.ones(zero.shape, dtype=bool)
            zero = zero | ((self.scale_np & 0x7F) == 0)
        return zero

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
    target: MarlinTarget  # the run's, as it applies to this projection's quant (MarlinTarget.for_quant)
    sf: float
    decoded: ProjectionTensors | None = None
    reference: ProjectionTensors | None = None
    file: str | None = None
    tiles: RankTiles | None = None  # a padded --tp/--ep container: one Marlin block per rank (padded_layout)


@dataclass
class GemmCase:
    """One sampled projection: `source` (the reference, in source form) and the Marlin tensors the
    kernel will use, with `mglobal` already the value the engine applies (the gate's for up)."""
    source: ProjectionTensors
    qweight: torch.Tensor
    mscale: torch.Tensor
    mglobal: torch.Tensor | None
    target: MarlinTarget  # the run's, as it applies to this projection's quant (MarlinTarget.for_quant)
    sf: float
    rows: int = 16
    seed: int = 0
    file: str | None = None
    tiles: RankTiles | None = None  # a padded --tp/--ep container: the kernel of rank r sees block r

    @cached_property
    def errors(self) -> tuple[float, float]:
        """(relative Frobenius error, max abs error) of x @ W_marlin.T against x @ W_source.T."""
        from .emulate import gemm_errors
        return gemm_errors(self)
