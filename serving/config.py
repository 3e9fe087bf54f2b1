"""The converted checkpoint's `quantization_config` (docs/FORMAT.md), parsed without any engine.

Everything an engine plugin decides before it touches a tensor lives here and is pure: parsing and
validating the block, refusing a layout tag written for another engine, finding the FP4 format of
an experts module from the engine's layer prefix, and refusing per-rank shapes the engine would pad.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dsv4_convert.core.engines import (
    ACT_DTYPES,
    ENGINES,
    FORMAT_VERSION,
    LAYOUTS,
    QUANT_METHOD,
    READABLE_FORMAT_VERSIONS,
    parallel_flags,
    registration_log_line,
    version_tuple,
)
from dsv4_convert.formats.tiles import GROUP_SIZE, OK, PAD, moe_rank_tiles, working_layouts

__all__ = [
    "FORMAT_VERSION",
    "LAYOUTS",
    "QUANT_METHOD",
    "MarlinFp4Spec",
    "PluginConfigError",
    "check_layout",
    "check_rank_shape",
    "check_tp_layout",
    "rank_param_sizes",
    "expert_container",
    "parse_quant_config",
    "registration_log_line",
    "working_tp_sizes",
]

FORMATS = tuple(GROUP_SIZE)


class PluginConfigError(ValueError):
    """The checkpoint's quantization_config cannot be served by this engine; the message says why."""


@dataclass(frozen=True, slots=True)
class MarlinFp4Spec:
    marlin_layout: str
    target_engine: str
    act_dtype: str
    w4a8: bool
    weight_format: str
    group_size: int
    experts: dict[str, str]
    rescale_factors: dict[str, float]
    original_quantization_config: dict | None
    format_version: int = FORMAT_VERSION
    target_engine_version: str | None = None
    tp_layout: dict | None = None  # the `--tp/--ep` record (docs/FORMAT.md), None when layout-agnostic
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def format_of(self, container: str) -> str:
        return self.experts[container]

    @property
    def padded(self) -> bool:
        """True when some experts container was written padded for the one recorded (TP, EP)."""
        return self.tp_layout is not None and any(
            c["status"] == PAD for c in self.tp_layout["containers"].values())


_LAYOUT_KEYS = ("hidden", "intermediate", "i_shard", "i_pad", "h_pad")


def _tp_layout_problems(tl, experts) -> list[str]:
    if not isinstance(tl, dict):
        return ["tp_layout must be an object {tp, ep, containers}"]
    out = [f"tp_layout.{k} must be a positive integer" for k in ("tp", "ep")
           if not (isinstance(tl.get(k), int) and tl[k] >= 1)]
    containers = tl.get("containers")
    if not isinstance(containers, dict):
        return [*out, "tp_layout.containers must map each experts container to its padded sizes"]
    for name, c in containers.items():
        if name not in experts:
            out.append(f"tp_layout.containers[{name!r}] is not listed in experts")
        elif not isinstance(c, dict) or c.get("status") not in (OK, PAD) or not all(
                isinstance(c.get(k), int) and c[k] > 0 for k in _LAYOUT_KEYS):
            out.append(f"tp_layout.containers[{name!r}] needs status ok|pad and positive integer "
                       f"{', '.join(_LAYOUT_KEYS)}")
    return out


def parse_quant_config(cfg: dict) -> MarlinFp4Spec:
    """Validate the whole block at once and list every problem in one error."""
    if not isinstance(cfg, dict):
        raise PluginConfigError(f"quantization_config must be a JSON object, got {type(cfg).__name__}")
    problems = []
    if cfg.get("quant_method") != QUANT_METHOD:
        problems.append(f"quant_method is {cfg.get('quant_method')!r}, expected {QUANT_METHOD!r}")
    version = cfg.get("format_version")
    if version not in READABLE_FORMAT_VERSIONS:
        problems.append(
            f"format_version is {version!r}; this plugin reads format_version "
            f"{' or '.join(map(str, READABLE_FORMAT_VERSIONS))} "
            "(upgrade dsv4-convert in the server environment)"
        )
    layout = cfg.get("marlin_layout")
    if layout is None:
        problems.append("marlin_layout is missing (every dsv4-convert checkpoint records it; re-convert)")
    elif layout not in LAYOUTS:
        problems.append(f"marlin_layout {layout!r} is unknown; known tags: {sorted(LAYOUTS)}")
    act = cfg.get("act_dtype")
    if act not in ACT_DTYPES:
        problems.append(f"act_dtype is {act!r}, expected one of {ACT_DTYPES}")
    experts = cfg.get("experts")
    if not isinstance(experts, dict) or not experts:
        problems.append("experts must map each experts module to 'nvfp4' or 'mxfp4'")
        experts = {}
    for name, fmt in experts.items():
        if fmt not in FORMATS:
            problems.append(f"experts[{name!r}] is {fmt!r}, expected one of {FORMATS}")
    rescale = cfg.get("rescale_factors", {})
    if not isinstance(rescale, dict):
        problems.append("rescale_factors must be an object")
        rescale = {}
    original = cfg.get("original_quantization_config")
    if original is not None and not (isinstance(original, dict) and "quant_method" in original):
        problems.append(
            "original_quantization_config must be the source's block (with its quant_method) or null"
        )
    tp_layout = cfg.get("tp_layout")
    if tp_layout is not None:
        problems += _tp_layout_problems(tp_layout, experts)
    if problems:
        raise PluginConfigError("dsv4-convert checkpoint config refused:\n  - " + "\n  - ".join(problems))
    return MarlinFp4Spec(
        marlin_layout=layout,
        target_engine=cfg.get("target_engine", LAYOUTS[layout].name),
        act_dtype=act,
        w4a8=bool(cfg.get("w4a8", False)),
        weight_format=cfg.get("weight_format", next(iter(experts.values()))),
        group_size=int(cfg.get("group_size", GROUP_SIZE["nvfp4"])),
        experts=dict(experts),
        rescale_factors={k: float(v) for k, v in rescale.items()},
        original_quantization_config=original,
        format_version=version,
        target_engine_version=cfg.get("target_engine_version"),
        tp_layout=tp_layout,
        raw=dict(cfg),
    )


def check_layout(
    spec: MarlinFp4Spec, *, engine: str, engine_version: str, model_dtype: str | None = None
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
    if spec.w4a8 and not ENGINES[engine].w4a8:
        raise PluginConfigError("w4a8 (fp8 activations) checkpoints exist only for vLLM")
    if model_dtype is not None and model_dtype != spec.act_dtype and "nvfp4" in spec.experts.values():
        raise PluginConfigError(
            f"this NVFP4 checkpoint was converted for {spec.act_dtype} activations but the server runs "
            f"{model_dtype}: its scale bytes and globals depend on the activation dtype. Start the server with "
            f"--dtype {spec.act_dtype}, or re-convert with --act-dtype {model_dtype}."
        )


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP = re.compile(r"(?:^|\.)mtp\.(\d+)\.")


def expert_container(spec: MarlinFp4Spec, prefix: str, *, num_hidden_layers: int | None = None) -> str | None:
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
    if m := _MTP.search(p):
        return by_mtp.get(int(m.group(1)))
    if ".decoder." in p or p.startswith("decoder."):
        return by_mtp.get(0)
    if m := _LAYER.search(p):
        idx = int(m.group(1))
        if num_hidden_layers is not None and idx >= num_hidden_layers:
            return by_mtp.get(idx - num_hidden_layers)
        return by_layer.get(idx)
    return None


def working_tp_sizes(fmt: str, engine: str, *, intermediate: int, hidden: int, limit: int = 64) -> list[int]:
    """TP sizes (EP 1, up to `limit`) whose per-rank shapes the engine does not pad."""
    return [tp for tp, _ in working_layouts(fmt, engine, hidden=hidden, intermediate=intermediate,
                                            candidates=[(tp, 1) for tp in range(1, limit + 1)])]


def check_rank_shape(fmt: str, engine: str, *, intermediate: int, hidden: int, tp_size: int,
                     ep_size: int = 1) -> None:
    """Refuse a split whose per-rank shapes the engine would pad (slicing packed tiles is then wrong).
    `tp_size` is the engine's MoE TP (TP / EP) and `intermediate` the layer's full I."""
    v = moe_rank_tiles(fmt, engine, hidden=hidden, intermediate=intermediate, tp=tp_size * ep_size, ep=ep_size)
    if v.ok:
        return
    ok = working_layouts(fmt, engine, hidden=hidden, intermediate=intermediate)
    raise PluginConfigError(
        f"{fmt} experts cannot be loaded pre-packed at {v.layout()}: {v.reason}; the packed tiles would no "
        f"longer line up. Layouts that work for this model: "
        f"{', '.join(f'TP {t} / EP {e}' for t, e in ok) or 'none'}. Otherwise serve the unconverted checkpoint."
    )


def _layout_text(tp: int, ep: int) -> str:
    return f"TP {tp} / EP {ep}"


def check_tp_layout(spec: MarlinFp4Spec, *, tp: int, ep: int) -> None:
    """A checkpoint written padded for one (TP, EP) (`--tp/--ep`) serves exactly that split: each rank's
    block holds that rank's padded slice. `tp` is the engine's whole TP (MoE TP x EP)."""
    if not spec.padded:
        return
    want = spec.tp_layout["tp"], spec.tp_layout["ep"]
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


def rank_param_sizes(spec: MarlinFp4Spec, container: str, engine: str, *, hidden: int, i_shard: int,
                     moe_tp: int, ep: int = 1) -> tuple[int, int]:
    """(H, I) per rank of the plugin's expert parameters for `container`, given the layer's unpadded
    hidden size and per-rank intermediate size. A padded `tp_layout` gives its recorded sizes (after
    checking the split and that the one tile rule gives the same numbers); otherwise the layer must
    need no padding (check_rank_shape) and the sizes are the unpadded ones."""
    fmt = spec.format_of(container)
    check_tp_layout(spec, tp=moe_tp * ep, ep=ep)
    rec = (spec.tp_layout or {}).get("containers", {}).get(container) if spec.padded else None
    if rec is None or rec["status"] == OK:
        check_rank_shape(fmt, engine, intermediate=i_shard * moe_tp, hidden=hidden, tp_size=moe_tp, ep_size=ep)
        return hidden, i_shard
    v = moe_rank_tiles(fmt, engine, hidden=rec["hidden"], intermediate=rec["intermediate"],
                       tp=moe_tp * ep, ep=ep)
    got = (rec["hidden"], rec["i_shard"], rec["h_pad"], rec["i_pad"])
    if (hidden, i_shard) != got[:2] or (v.status, v.hidden, v.i_shard, v.h_pad, v.i_pad) != (PAD, *got):
        raise PluginConfigError(
            f"{container}: tp_layout records H={rec['hidden']} I_shard={rec['i_shard']} padded to "
            f"H={rec['h_pad']} I={rec['i_pad']}, but the model has H={hidden} I_shard={i_shard} and {engine} "
            f"pads it to H={v.h_pad} I={v.i_pad} ({v.status}). Re-convert with this dsv4-convert version."
        )
    return v.h_pad, v.i_pad
