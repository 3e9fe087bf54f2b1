"""The source-format table: one row per checkpoint format dsv4-convert reads, and the only place that says what a
format is. Detection (core/sources/detect.py) tries the rows in table order, the first whose detector gives a reason
wins; grouping, the converters (convert/plan.py, cpu_path.py, reverse.py), validate's quant_config checks,
the serving plugins and synth read the row's fields, never the format's name. A new format is a new row here
(CONTRIBUTING.md, "A new source format"; tests/core/test_source_formats.py proves a toy row reaches every
consumer). Facts: docs/spec/CHECKPOINT_FORMATS.md §3-§7, docs/FORMAT.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...formats.tiles import EnginePadding
from ..checkpoint.tensor_model import Quant
from ..targets.engines import engine_facts
from . import detectors

__all__ = ["FORMATS", "MULTIPLIER", "RECIPROCAL", "GlobalRule", "SourceFormat", "SynthSpec", "Suffixes",
           "engine_padding", "global_rule_of", "reciprocal_global", "source_format", "synth_formats",
           "tensor_suffixes"]


@dataclass(frozen=True)
class Suffixes:
    """What follows an expert projection's prefix for each of its tensors (None: the format has none)."""
    weight: str
    scale: str
    global_scale: str | None = None
    input_scale: str | None = None


@dataclass(frozen=True)
class GlobalRule:
    """How an NVFP4 format stores its per-tensor global scale. ModelOpt's `weight_scale_2` is the multiplier
    amax / (6 * 448), one F32; compressed-tensors' `weight_global_scale` is its reciprocal, [1] (or [2] for a fused
    gate/up), and the converter writes the multiplier beside a kept copy of the source's tensor."""
    reciprocal: bool
    kept_as: str  # the suffix under which the converted checkpoint keeps the source's global (marlin-to-source)


MULTIPLIER = GlobalRule(reciprocal=False, kept_as="weight_scale_2")
RECIPROCAL = GlobalRule(reciprocal=True, kept_as="ct_weight_global_scale")


@dataclass(frozen=True)
class SynthSpec:
    """How `synth` writes the format. `tree`: the model it lays out ("deepseek-v4": V4's own names, FP8 attention,
    gate/down/up file order; "hf": a Hugging Face MoE; "gpt-oss": gpt-oss's stacked experts). `config`: which
    config writer of synth/configs.py. `mtp_format`: the format of the MTP experts when it is another (ModelOpt
    keeps DeepSeek-V4's MTP experts MXFP4). `linear`: how a family's quantised dense linears are written
    ("nvfp4": ModelOpt's tensors, "ct-nvfp4": compressed-tensors' tensors)."""
    tree: str
    config: str
    mtp_format: str | None = None
    linear: str = "nvfp4"


@dataclass(frozen=True, eq=False)
class SourceFormat:
    """One source format. Rows compare and hash by `value`, their name (what inspect prints, the converted
    record's `source_format`, synth's --format)."""
    value: str
    summary: str
    detect: Callable[..., str | None]  # (row, config, hf_quant_config, tensors) -> reason or None
    quants: frozenset[Quant]  # the FP4 encodings its experts may hold
    trunk: Quant | None  # what the routed experts must be (detect.contradiction otherwise); None: either
    suffixes: Suffixes | None  # per-expert tensors; None for stacked experts (gpt-oss's *_blocks / *_scales)
    weight_dtype: str  # the packed codes' safetensors dtype
    scale_dtype: str  # the block scales' dtype
    config_blocks: tuple[str, ...]  # where the config files declare it (inspect's reason, docs/FORMAT.md)
    moe_method: Quant | None  # the FP4 MoE method the engines build for it (structure.quant_config.method)
    # its config quantises every linear not excluded (structure.quant_config.exclusions): no default, so that a
    # new row says which of validate's source checks run for it
    every_linear: bool
    global_rule: GlobalRule | None = None  # NVFP4 formats: how the global scale is stored
    quant_algos: frozenset[str] = frozenset()  # ModelOpt quant_algo spellings that name it (upper case)
    ct_format: str | None = None  # compressed-tensors `format` that names it
    converted: bool = False  # this tool's own output: the Marlin checks run, the source checks do not
    model_type: str | None = None  # the model type the format implies when the record does not say
    synth: SynthSpec | None = None  # None: synth does not write it
    notes: tuple[str, ...] = field(default=())  # producers and versions seen writing it (docs)

    @property
    def block_size(self) -> int | None:
        return self.trunk.group_size if self.trunk is not None else None

    def __eq__(self, other) -> bool:
        return isinstance(other, SourceFormat) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"SourceFormat({self.value!r})"

    def __reduce__(self):  # worker processes get the row by name, from the table they import
        return source_format, (self.value,)


_NVFP4_ALGOS = frozenset({"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "NVFP4_SVD"})
# ModelOpt 0.47 writes its MXFP4 export's algorithm lower-case, `"quant_algo": "mxfp4"`, in both config files
# (modelopt/torch/export/quant_utils.py process_layer_quant_config: `{"quant_algo": v}` for "mxfp4"); 0.48
# writes the weight-only export as `W4A16_MXFP4` (issue #35; tests/fixtures/producers/*-w4a16-mxfp4/README.md)
_MXFP4_ALGOS = frozenset({"MXFP4", "W4A8_MXFP4_FP8", "W4A16_MXFP4"})
_MODELOPT = Suffixes("weight", "weight_scale", "weight_scale_2", "input_scale")
_CT_NVFP4 = Suffixes("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
_BOTH = frozenset({Quant.NVFP4, Quant.MXFP4})

# In detection order: most specific first.
_ROWS = (
    SourceFormat("marlin", "this tool's own output (quant_method marlin_fp4): Marlin words, permuted scales",
                 detectors.marlin, _BOTH, None, Suffixes("weight", "weight_scale", "weight_global_scale"),
                 "I32", "F8_E4M3 / F8_E8M0", ("config.json quantization_config (quant_method marlin_fp4)",),
                 moe_method=None, every_linear=False, converted=True),
    SourceFormat("nvfp4-modelopt-dsv4", "ModelOpt re-quant with DeepSeek names (MTP experts stay MXFP4)",
                 detectors.modelopt_dsv4, _BOTH, Quant.NVFP4, _MODELOPT, "U8", "F8_E4M3",
                 ("config.json quantization_config (quant_method fp8, moe_quant_algo NVFP4)",
                  "hf_quant_config.json quantization (MIXED_PRECISION, NVFP4 quantized_layers)"),
                 moe_method=Quant.NVFP4, every_linear=False, global_rule=MULTIPLIER, quant_algos=_NVFP4_ALGOS,
                 model_type="deepseek_v4",
                 synth=SynthSpec("deepseek-v4", "modelopt-dsv4", mtp_format="mxfp4-dsv4")),
    SourceFormat("mxfp4-modelopt-hf", "ModelOpt MXFP4 export: weight U8 + weight_scale U8 (E8M0 bits)",
                 detectors.modelopt_algo, frozenset({Quant.MXFP4}), Quant.MXFP4, Suffixes("weight", "weight_scale"),
                 "U8", "U8", ("config.json quantization_config (quant_method modelopt, quant_algo)",
                              "hf_quant_config.json quantization.quant_algo"),
                 moe_method=Quant.MXFP4, every_linear=False, quant_algos=_MXFP4_ALGOS,
                 notes=("ModelOpt 0.47 `mxfp4`", "ModelOpt 0.48 `W4A16_MXFP4`")),
    SourceFormat("nvfp4-modelopt-hf", "ModelOpt generic HF names (gate/up/down_proj)",
                 detectors.modelopt_hf, frozenset({Quant.NVFP4}), Quant.NVFP4, _MODELOPT, "U8", "F8_E4M3",
                 ("config.json quantization_config (quant_method modelopt)",
                  "hf_quant_config.json quantization (NVFP4 quant_algo or MIXED_PRECISION)"),
                 moe_method=Quant.NVFP4, global_rule=MULTIPLIER, quant_algos=_NVFP4_ALGOS, every_linear=True,
                 synth=SynthSpec("hf", "modelopt-hf")),
    SourceFormat("nvfp4-ct", "compressed-tensors nvfp4-pack-quantized (reciprocal global)",
                 detectors.ct, frozenset({Quant.NVFP4}), Quant.NVFP4, _CT_NVFP4, "U8", "F8_E4M3",
                 ("config.json quantization_config (quant_method compressed-tensors, format)",),
                 moe_method=Quant.NVFP4, global_rule=RECIPROCAL, ct_format="nvfp4-pack-quantized", every_linear=True,
                 synth=SynthSpec("hf", "ct", linear="ct-nvfp4")),
    SourceFormat("mxfp4-ct", "compressed-tensors mxfp4-pack-quantized",
                 detectors.ct, frozenset({Quant.MXFP4}), Quant.MXFP4, Suffixes("weight_packed", "weight_scale"),
                 "U8", "U8", ("config.json quantization_config (quant_method compressed-tensors, format)",),
                 moe_method=Quant.MXFP4, every_linear=False, ct_format="mxfp4-pack-quantized",
                 synth=SynthSpec("hf", "ct")),
    SourceFormat("mxfp4-gptoss", "gpt-oss *_blocks / *_scales, gate/up interleaved row by row",
                 detectors.gptoss, frozenset({Quant.MXFP4}), Quant.MXFP4, None, "U8", "U8",
                 ("config.json quantization_config (quant_method mxfp4)",), moe_method=Quant.MXFP4, every_linear=False,
                 model_type="gpt_oss", synth=SynthSpec("gpt-oss", "gpt-oss")),
    SourceFormat("mxfp4-dsv4", "DeepSeek-V4 native: experts w{1,2,3}.weight I8 + .scale F8_E8M0",
                 detectors.dsv4_native, frozenset({Quant.MXFP4}), Quant.MXFP4, Suffixes("weight", "scale"), "I8",
                 "F8_E8M0", ("config.json expert_dtype fp4",), moe_method=Quant.MXFP4, every_linear=False,
                 model_type="deepseek_v4",
                 synth=SynthSpec("deepseek-v4", "dsv4")),
)
FORMATS: dict[str, SourceFormat] = {row.value: row for row in _ROWS}


def source_format(name: str) -> SourceFormat:
    """The row named `name`; ValueError for a name the table does not hold (as the enum it replaces raised)."""
    row = FORMATS.get(name) if isinstance(name, str) else name if isinstance(name, SourceFormat) else None
    if row is None:
        raise ValueError(f"{name!r} is not a source format (known: {', '.join(FORMATS)})")
    return row


def tensor_suffixes() -> Suffixes:
    """Every source row's suffixes, in table order, one tuple per part (grouping and detection look a
    projection's tensors up by these; a new row's names are known to them without another edit)."""
    rows = [r.suffixes for r in FORMATS.values() if r.suffixes is not None and not r.converted]
    return Suffixes(*(tuple(dict.fromkeys(getattr(s, part) for s in rows if getattr(s, part)))
                      for part in ("weight", "scale", "global_scale", "input_scale")))


def global_rule_of(tensor: str) -> GlobalRule | None:
    """The global-scale rule of the source row whose global suffix ends `tensor` (a projection read without
    its checkpoint's format)."""
    return next((r.global_rule for r in FORMATS.values() if r.suffixes and r.suffixes.global_scale
                 and not r.converted and tensor.endswith("." + r.suffixes.global_scale)), None)


def reciprocal_global(name: str) -> bool:
    """Whether the format named `name` (a converted record's source_format) stores its global as a reciprocal
    (compressed-tensors): the plugins then register the kept source globals, and serve as the engine's own
    compressed-tensors method does."""
    row = FORMATS.get(name)
    return bool(row and row.global_rule and row.global_rule.reciprocal)


def engine_padding(engine: str, name: str | None) -> EnginePadding:
    """How `engine` pads the experts of a source in the format named `name` (a converted record's source_format;
    None: the engine's native rule): the rule of the MoE method it builds for that source (core/targets/engines.py
    EngineFacts.padding_for: a compressed-tensors source gets its compressed-tensors method)."""
    row = FORMATS.get(name) if isinstance(name, str) else None
    return engine_facts(engine).padding_for(row.ct_format if row else None)


def synth_formats() -> tuple[str, ...]:
    """The formats synth writes, in table order."""
    return tuple(name for name, row in FORMATS.items() if row.synth is not None)
