"""The converted checkpoint's `quantization_config` (docs/FORMAT.md), parsed without any engine.

Everything an engine plugin decides before it touches a tensor lives here and is pure: parsing and
validating the block, refusing a layout tag written for another engine, finding the FP4 format of
an experts module from the engine's layer prefix, and refusing per-rank shapes the engine would pad.
"""

from __future__ import annotations

import re

from ..core.record.converted_config import ConvertedConfigError, ConvertedQuantConfig, serving_block
from ..core.sources.source_formats import engine_padding
from ..core.targets.engines import (
    ENGINES,
    LAYOUTS,
    EngineError,
    engine_facts,
    parallel_flags,
    release_for,
    version_tuple,
    w4a8_problem,
)
from ..formats.tiles import OK, PAD, moe_rank_tiles, working_layouts

__all__ = [
    "PluginConfigError",
    "check_layout",
    "check_rank_shape",
    "check_tp_layout",
    "checked_source",
    "rank_param_sizes",
    "expert_container",
    "parse_quant_config",
    "working_tp_sizes",
]


class PluginConfigError(ValueError):
    """The checkpoint's quantization_config cannot be served by this engine; the message says why."""


def parse_quant_config(cfg: dict) -> ConvertedQuantConfig:
    """The one parser (core/record/converted_config.py), every problem with its error id in one PluginConfigError."""
    try:
        return ConvertedQuantConfig.parse(cfg)
    except ConvertedConfigError as e:
        raise PluginConfigError(f"dsv4-convert checkpoint config refused: {e.message}") from None


def check_layout(
    spec: ConvertedQuantConfig, *, engine: str, engine_version: str, model_dtype: str | None = None
) -> None:
    """Refuse a checkpoint whose bytes were laid out for another engine (or an older version)."""
    facts = LAYOUTS[spec.marlin_layout]
    tag_engine, oldest, checked = facts.name, facts.oldest, facts.version
    if tag_engine != engine:
        other = ENGINES[engine].layout_tag
        raise PluginConfigError(
            f"this checkpoint was converted for {tag_engine} (marlin_layout {spec.marlin_layout!r}) but is being "
            f"loaded by {engine} {engine_version}, which expects {other!r}: the NVFP4 scale bytes and global "
            f"scales differ between the engines. Re-convert with `--target {engine}`, or serve it with {tag_engine}."
        )
    have = version_tuple(engine_version)
    if have < oldest:
        raise PluginConfigError(
            f"marlin_layout {spec.marlin_layout!r} needs {engine} >= {'.'.join(map(str, oldest))} (checked on "
            f"{checked}); the running {engine} is {engine_version}, whose Marlin layout differs. Upgrade {engine}."
        )
    try:  # the running engine's release (core/targets/engines.py): what it can serve
        release_for(engine, engine_version)
    except EngineError as e:
        raise PluginConfigError(f"{e.message}. Fix: {e.hint}") from None
    if spec.w4a8 and (why := w4a8_problem(engine, engine_version)):
        raise PluginConfigError(why)
    if model_dtype is not None and model_dtype != spec.act_dtype and "nvfp4" in spec.experts.values():
        raise PluginConfigError(
            f"this NVFP4 checkpoint was converted for {spec.act_dtype} activations but the server runs "
            f"{model_dtype}: its scale bytes and globals depend on the activation dtype. Start the server with "
            f"--dtype {spec.act_dtype}, or re-convert with --act-dtype {model_dtype}."
        )


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP = re.compile(r"(?:^|\.)mtp\.(?:layers\.)?(\d+)\.")  # DeepSeek `mtp.0.`, Qwen3.5 / Qwen3-Next `mtp.layers.0.`
# SGLang 0.5.23's DSpark draft (models/deepseek_v4_dspark.py) builds DeepSeek-V4.1's stage `mtp.N` as `stages.N`
_STAGE = re.compile(r"(?:^|\.)stages\.(\d+)\.")


def checked_source(config: dict, *, engine: str, engine_version: str) -> tuple[ConvertedQuantConfig, dict | None]:
    """What each plugin's `from_config` starts from: the checkpoint's block parsed, its layout checked against the
    running engine (refused before any layer is built), and the source's own quantisation block that the engine's
    config for the non-expert layers is built from (None: the source quantised nothing else)."""
    spec = parse_quant_config(config)
    check_layout(spec, engine=engine, engine_version=engine_version)
    return spec, serving_block(spec)


def expert_container(spec: ConvertedQuantConfig, prefix: str, *, num_hidden_layers: int | None = None) -> str | None:
    """The checkpoint's experts container for an engine layer prefix, or None if it holds no FP4 experts.

    Engines rename modules (`model.layers.3.mlp.experts`, `model.layers.3.ffn.experts`) and put MTP
    layers after the decoder layers (`model.layers.{num_hidden_layers + i}`) or under
    `model.decoder`/`mtp`; the checkpoint keeps `layers.3.ffn.experts` and `mtp.0.ffn.experts`."""
    by_layer, by_mtp = {}, {}
    for name in spec.experts:
        if m := _MTP.search(name + "."):
            by_mtp[int(m.group(1))] = name
        elif m := _LAYER.search(name + "."):
            by_layer[int(m.group(1))] = name
    p = prefix + "."
    if m := _MTP.search(p) or _STAGE.search(p):
        return by_mtp.get(int(m.group(1)))
    if ".decoder." in p or p.startswith("decoder."):
        return by_mtp.get(0)
    if m := _LAYER.search(p):
        idx = int(m.group(1))
        if num_hidden_layers is not None and idx >= num_hidden_layers:
            return by_mtp.get(idx - num_hidden_layers)
        return by_layer.get(idx)
    return None


def working_tp_sizes(fmt: str, engine: str, *, intermediate: int, hidden: int, limit: int = 64,
                     gated: bool = True) -> list[int]:
    """TP sizes (EP 1, up to `limit`) whose per-rank shapes the engine does not pad."""
    return [tp for tp, _ in working_layouts(fmt, engine_facts(engine).padding, hidden=hidden, intermediate=intermediate,
                                            candidates=[(tp, 1) for tp in range(1, limit + 1)], gated=gated)]


def check_rank_shape(fmt: str, engine: str, *, intermediate: int, hidden: int, tp_size: int,
                     ep_size: int = 1, gated: bool = True, source_format: str | None = None) -> None:
    """Refuse a split whose per-rank shapes the engine would pad (slicing packed tiles is then wrong).
    `tp_size` is the engine's MoE TP (TP / EP) and `intermediate` the layer's full I; `source_format`: the
    converted source's, whose engine method's padding applies (core/sources/source_formats.py engine_padding)."""
    padding = engine_padding(engine, source_format)
    v = moe_rank_tiles(fmt, padding, hidden=hidden, intermediate=intermediate, tp=tp_size * ep_size,
                       ep=ep_size, gated=gated)
    if v.ok:
        return
    ok = working_layouts(fmt, padding, hidden=hidden, intermediate=intermediate, gated=gated)
    raise PluginConfigError(
        f"{fmt} experts cannot be loaded pre-packed at {v.layout()}: {v.reason}; the packed tiles would no "
        f"longer line up. Layouts that work for this model: "
        f"{', '.join(f'TP {t} / EP {e}' for t, e in ok) or 'none'}. Otherwise serve the unconverted checkpoint."
    )


def _layout_text(tp: int, ep: int) -> str:
    return f"TP {tp} / EP {ep}"


def check_tp_layout(spec: ConvertedQuantConfig, *, tp: int, ep: int) -> None:
    """A checkpoint written padded for one (TP, EP) (`--tp/--ep`) serves exactly that split: each rank's
    block holds that rank's padded slice. `tp` is the engine's whole TP (MoE TP x EP)."""
    if not spec.padded:
        return
    want = spec.tp_layout.tp, spec.tp_layout.ep
    if (tp, ep) == want:
        return
    t, e = want
    engine = spec.target_engine
    serve = parallel_flags(engine, tp=t, ep=e)
    raise PluginConfigError(
        f"this checkpoint was converted padded for {_layout_text(t, e)} (quantization_config.tp_layout): its "
        f"expert tensors hold each of those ranks' padded slices and serve only that split, but {engine} runs "
        f"{_layout_text(tp, ep)}. Serve it with {serve}, or re-convert the source with `--tp {tp} --ep {ep}`."
    )


def rank_param_sizes(spec: ConvertedQuantConfig, container: str, engine: str, *, hidden: int, i_shard: int,
                     moe_tp: int, ep: int = 1, gated: bool = True) -> tuple[int, int]:
    """(H, I) per rank of the plugin's expert parameters for `container`, given the layer's unpadded
    hidden size and per-rank intermediate size. A padded `tp_layout` gives its recorded sizes (after
    checking the split and that the one tile rule gives the same numbers); otherwise the layer must
    need no padding (check_rank_shape) and the sizes are the unpadded ones."""
    fmt = spec.format_of(container)
    check_tp_layout(spec, tp=moe_tp * ep, ep=ep)
    rec = spec.tp_layout.containers.get(container) if spec.padded else None
    if rec is None or rec.status == OK:
        check_rank_shape(fmt, engine, intermediate=i_shard * moe_tp, hidden=hidden, tp_size=moe_tp, ep_size=ep,
                         gated=gated, source_format=spec.source_format)
        return hidden, i_shard
    v = moe_rank_tiles(fmt, engine_padding(engine, spec.source_format), hidden=rec.hidden,
                       intermediate=rec.intermediate, tp=moe_tp * ep,
                       ep=ep, gated=gated)
    got = (rec.hidden, rec.i_shard, rec.h_pad, rec.i_pad)
    if (hidden, i_shard) != got[:2] or (v.status, v.hidden, v.i_shard, v.h_pad, v.i_pad) != (PAD, *got):
        raise PluginConfigError(
            f"{container}: tp_layout records H={rec.hidden} I_shard={rec.i_shard} padded to "
            f"H={rec.h_pad} I={rec.i_pad}, but the model has H={hidden} I_shard={i_shard} and {engine} "
            f"pads it to H={v.h_pad} I={v.i_pad} ({v.status}). Re-convert with this dsv4-convert version."
        )
    return v.h_pad, v.i_pad
