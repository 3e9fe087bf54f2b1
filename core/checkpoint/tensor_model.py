"""The checkpoint model that the reader builds and the converter and validator share.

A checkpoint is a set of TensorRefs (from headers only) plus the FP4 Projections grouped from them;
everything that is not part of a Projection is a passthrough tensor, copied byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ...formats.constants import MXFP4_GROUP, NVFP4_GROUP

__all__ = ["Quant", "Role", "TensorRef", "Projection", "Checkpoint", "MoeLayer", "gated_experts", "moe_layers"]


class Quant(str, Enum):
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"

    @property
    def group_size(self) -> int:
        return NVFP4_GROUP if self is Quant.NVFP4 else MXFP4_GROUP

    @property
    def convert_command(self) -> str:
        """The dsv4-convert command that converts experts of this format."""
        return f"{self.value}-to-marlin"


class Role(str, Enum):
    GATE = "gate"  # w1 / gate_proj: first half of the engines' w13
    UP = "up"      # w3 / up_proj: second half of w13
    DOWN = "down"  # w2 / down_proj


@dataclass(frozen=True, slots=True)
class TensorRef:
    """One tensor as its shard header describes it; `begin`/`end` are absolute file offsets."""
    name: str
    file: str  # shard file name, relative to the checkpoint root
    dtype: str  # safetensors dtype string
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class Projection:
    """One FP4 expert projection: weight [N, K/2] codes, block scales [N, K/g], optional globals.

    `key` is the common name prefix (`layers.3.ffn.experts.17.w1`). For stacked sources (gpt-oss, Llama-4)
    `expert_index` selects along dim 0 and `row_start`/`row_step` pick the gate/up rows (interleaved, or halves).
    For Marlin sources (this tool's output) `weight`/`scale` are the packed tensors and
    `marlin_global` the processed global."""
    key: str
    layer: str  # "3", or "mtp.0" for MTP blocks
    expert: int
    role: Role
    quant: Quant
    n: int
    k: int
    weight: TensorRef
    scale: TensorRef
    global_scale: TensorRef | None = None  # NVFP4 ModelOpt weight_scale_2, or CT weight_global_scale
    input_scale: TensorRef | None = None
    marlin_global: TensorRef | None = None
    expert_index: int | None = None
    row_start: int = 0
    row_step: int = 1
    k_major: bool = False  # stacked [E, K/2, rows] (Llama-4): the expert's slab is transposed before the rows

    @property
    def k_blocks(self) -> int | None:
        """Block scales along K, as the scale tensor stores them (its second-to-last dim when K-major)."""
        shape = self.scale.shape
        return (shape[-2] if self.k_major else shape[-1]) if len(shape) >= (2 if self.k_major else 1) else None

    @property
    def rows(self) -> slice:
        """Which rows of the expert's slab (after any transpose) are this projection's N rows."""
        return slice(self.row_start, self.row_start + self.n * self.row_step, self.row_step)

    @property
    def group_size(self) -> int:
        return self.quant.group_size

    @property
    def container(self) -> str:
        """The experts module of its layer: `layers.3.ffn.experts.17.w1` -> `layers.3.ffn.experts`."""
        return self.key.rsplit(".", 2)[0]

    @property
    def stack(self) -> str:
        """The engines' stacked tensor it belongs to: gate and up -> `w13`, down -> `w2`."""
        return "w2" if self.role is Role.DOWN else "w13"

    @property
    def source_refs(self) -> tuple[TensorRef, ...]:
        refs = (self.weight, self.scale, self.global_scale, self.input_scale, self.marlin_global)
        return tuple(r for r in refs if r is not None)


@dataclass(frozen=True)
class Checkpoint:
    """What the reader knows about a checkpoint directory from config files and headers alone."""
    root: Path
    format: object  # its row of the source-format table (core/sources/source_formats.py SourceFormat), which imports this module
    config: dict
    hf_quant_config: dict | None
    tensors: dict[str, TensorRef]  # every tensor, in file order
    projections: tuple[Projection, ...]
    other_files: tuple[str, ...] = field(default=())  # non-weight files to copy (configs, tokenizer, ...)
    left_out: tuple[str, ...] = field(default=())  # files under folders no engine reads (original/, metal/): not copied
    index_file: str | None = None  # "model.safetensors.index.json", or None for a single file
    format_reason: str = ""  # why detect_format chose `format` (inspect shows it)

    @property
    def projection_names(self) -> frozenset[str]:
        return frozenset(r.name for p in self.projections for r in p.source_refs)

    @property
    def routed_quant(self) -> Quant | None:
        """The FP4 format of the routed experts (MTP experts only decide when there are no others;
        a ModelOpt NVFP4 DeepSeek-V4 checkpoint keeps its MTP experts MXFP4)."""
        routed = [p.quant for p in self.projections if not p.layer.startswith("mtp")]
        routed = routed or [p.quant for p in self.projections]
        return max(set(routed), key=routed.count) if routed else None

    @property
    def passthrough(self) -> tuple[TensorRef, ...]:
        used = self.projection_names
        return tuple(t for t in self.tensors.values() if t.name not in used)


@dataclass(frozen=True, slots=True)
class MoeLayer:
    """One experts container as the tile rule sees it: its format and the full (unsplit) sizes."""
    container: str
    layer: str
    quant: Quant
    hidden: int
    intermediate: int
    experts: int
    gated: bool = True  # w13 = gate | up (the engines' gated MoE); False: up alone (Nemotron-H's ReLU-squared)


def gated_experts(roles) -> bool:
    """The one rule for a container's (or a layer's) experts, from the roles of their projections: gated when
    some expert has an up projection; non-gated experts (Nemotron-H) have their up_proj in the gate's role (the
    engines' w1, core/sources/naming.py)."""
    return any(r is Role.UP for r in roles)


def moe_layers(projections) -> dict[str, MoeLayer]:
    """experts container -> MoeLayer, from the down projection (N = H, K = I) or else the gate/up (N = I, K = H)."""
    shapes: dict[str, tuple] = {}
    experts: dict[str, set[int]] = {}
    roles: dict[str, set[Role]] = {}
    for p in projections:
        experts.setdefault(p.container, set()).add(p.expert)
        roles.setdefault(p.container, set()).add(p.role)
        if p.role is Role.DOWN or p.container not in shapes:
            shapes[p.container] = (p.layer, p.quant, *((p.n, p.k) if p.role is Role.DOWN else (p.k, p.n)))
    return {c: MoeLayer(c, *shapes[c], len(experts[c]), gated_experts(roles[c])) for c in shapes}
