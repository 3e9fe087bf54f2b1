"""`dsv4-convert inspect PATH [--json]`: what a checkpoint holds, from config files and headers only."""

from __future__ import annotations

from collections import Counter, defaultdict

import click

from ..core.checkpoint.dtypes import FP8_DTYPES, SCALE_DTYPES, WEIGHT_DTYPES
from ..core.checkpoint.index import natural_key
from ..core.checkpoint.reader import open_checkpoint
from ..core.checkpoint.tensor_model import Checkpoint
from ..core.record.converted_config import record_or_none
from ..core.sources.detect import declared_group_size
from ..core.sources.families import family_of
from ..core.sources.mtp import mtp_layers
from ..core.targets.verdicts import verdicts
from ..core.units import human_size, plural
from .report import emit, report_options

__all__ = ["SCHEMA_VERSION", "inspect", "render_table", "summarize"]

SCHEMA_VERSION = 1
_QUANT_KEYS = ("quant_method", "quant_algo", "moe_quant_algo", "format", "fmt", "scale_fmt",
               "weight_block_size", "group_size", "expert_dtype", "marlin_layout", "target_engine",
               "source_format", "weight_format")

EXAMPLES = """

\b
Examples:
  dsv4-convert inspect ./DeepSeek-V4-Flash
  dsv4-convert inspect nvidia/DeepSeek-V4-Flash-NVFP4 --json | jq .format
"""


def _category(dtype: str) -> str:
    return "fp8" if dtype in FP8_DTYPES else "bf16" if dtype == "BF16" else "other"


def _quant_block(ckpt: Checkpoint) -> dict:
    """config.json's quantization_config; a converted checkpoint's through its record (the one reader)."""
    if ckpt.format.converted:
        record = record_or_none(ckpt.config)
        return record.as_dict() if record else {}
    return ckpt.config.get("quantization_config") or {}


def _excluded(ckpt: Checkpoint) -> list[dict]:
    qc = _quant_block(ckpt)
    if ckpt.format.converted:
        qc = qc.get("original_quantization_config") or {}
    out = []
    for key in ("ignore", "modules_to_not_convert", "exclude_modules"):
        if isinstance(qc.get(key), list):
            out.append({"source": f"config.json quantization_config.{key}", "modules": qc[key]})
    hq = (ckpt.hf_quant_config or {}).get("quantization") or {}
    if isinstance(hq.get("exclude_modules"), list):
        out.append({"source": "hf_quant_config.json quantization.exclude_modules", "modules": hq["exclude_modules"]})
    return out


def _fp4_layers(ckpt: Checkpoint) -> set[str]:
    """Tensors of the FP4 layers that are not routed experts (ModelOpt NVFP4 attention and shared experts):
    a packed weight with an FP4 block scale beside it. Their F8_E4M3 scales are not FP8 layers."""
    out = set()
    scales = {*SCALE_DTYPES["nvfp4"], *SCALE_DTYPES["mxfp4"]}
    for name, ref in ckpt.tensors.items():
        if name.endswith(".weight_scale") and ref.dtype in scales:
            weight = ckpt.tensors.get(name[: -len("_scale")])
            if weight is not None and weight.dtype in WEIGHT_DTYPES:
                out.update({name, weight.name})
    return out


def summarize(ckpt: Checkpoint) -> dict:
    """The `--json` document (docs/INSPECT.md, schema_version 1)."""
    projections = ckpt.projections
    experts: dict[str, set[int]] = defaultdict(set)
    kinds: Counter = Counter()  # the projections by what their rows show; formatted once per kind, not per projection
    for p in projections:
        experts[p.layer].add(p.expert)
        w, s = p.weight, p.scale
        kinds[(p.role, p.quant, p.n, p.k, w.dtype, w.shape, s.dtype, s.shape, p.expert_index is not None)] += 1
    roles: dict[str, Counter] = defaultdict(Counter)
    by_quant: Counter = Counter()
    for (role, quant, n, k, w_dtype, w_shape, s_dtype, s_shape, stacked), count in kinds.items():
        shape = f"{w_dtype}{list(w_shape)} + {s_dtype}{list(s_shape)}"
        if stacked:
            shape = f"{quant.value} [{n}, {k}] from stacked " + shape
        roles[role.value][(quant.value, n, k, shape)] += count
        by_quant[quant.value] += count
    layers = sorted(experts, key=lambda layer: (layer.startswith("mtp."), natural_key(layer)))
    tensors, fp4, fp4_layers = ckpt.tensors, ckpt.projection_names, _fp4_layers(ckpt)
    by_cat = Counter(fp4_experts=sum(tensors[name].nbytes for name in fp4))
    for name, ref in tensors.items():
        if name not in fp4:
            by_cat["fp4_other" if name in fp4_layers else _category(ref.dtype)] += ref.nbytes
    dtypes = Counter(ref.dtype for ref in tensors.values())
    qc = _quant_block(ckpt)
    hq = (ckpt.hf_quant_config or {}).get("quantization") or {}
    declared = declared_group_size(ckpt.config, ckpt.hf_quant_config)
    mtp = mtp_layers(ckpt.tensors, ckpt.config)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": str(ckpt.root),
        "format": ckpt.format.value,
        "reason": ckpt.format_reason,
        "architectures": [str(a) for a in archs] if isinstance(archs := ckpt.config.get("architectures"), list) else [],
        "family": family.name if (family := family_of(ckpt.config)) else None,
        # per engine release: null where the plugin serves it (core/targets/served.py), else why not
        "served": verdicts(ckpt.config, ckpt.hf_quant_config, ckpt.format.value, ckpt.tensors),
        "shards": len({r.file for r in ckpt.tensors.values()}),
        "index_file": ckpt.index_file,
        "tensors": len(ckpt.tensors),
        "dtypes": dict(sorted(dtypes.items())),
        "layers": [layer for layer in layers if not layer.startswith("mtp.")],
        "mtp_layers": mtp,
        "experts_per_layer": {layer: len(experts[layer]) for layer in layers},
        "projections": {
            "total": len(projections),
            "by_quant": dict(by_quant),
            "by_role": {role: sum(c.values()) for role, c in sorted(roles.items())},
        },
        "shapes_by_role": {
            role: [{"quant": q, "n": n, "k": k, "tensors": s, "count": c}
                   for (q, n, k, s), c in sorted(counter.items())]
            for role, counter in sorted(roles.items())
        },
        "group_sizes": sorted({kind[1].group_size for kind in kinds}),
        "declared_group_size": declared[0] if declared else None,
        "bytes": {"fp4_experts": by_cat["fp4_experts"], "fp4_other": by_cat["fp4_other"], "fp8": by_cat["fp8"],
                  "bf16": by_cat["bf16"],
                  "other": by_cat["other"], "total": sum(by_cat.values())},
        "quantization_config": {k: qc[k] for k in _QUANT_KEYS if k in qc},
        "hf_quant_config": ({k: hq[k] for k in ("quant_algo", "kv_cache_quant_algo", "group_size") if k in hq}
                            | {"producer": (ckpt.hf_quant_config or {}).get("producer")})
        if ckpt.hf_quant_config is not None else None,
        "excluded_modules": _excluded(ckpt),
        "other_files": list(ckpt.other_files),
        "left_out": list(ckpt.left_out),  # under original/, metal/: no engine reads them, never copied
    }


def render_table(s: dict) -> str:
    """The readable form of `summarize`'s document."""
    rows: list[tuple[str, str]] = [
        ("checkpoint", s["root"]),
        ("format", f"{s['format']}  ({s['reason']})"),
        ("family", s["family"] or f"none ({', '.join(map(str, s['architectures'])) or 'no architectures'} is in no "
                                   "model family)"),
        ("served on", ", ".join(k for k, why in s["served"].items() if why is None) or "NOT SERVED on any engine"),
        *((f"  not on {k}", why) for k, why in s["served"].items() if why is not None),
        ("shards", f"{s['shards']} ({s['index_file'] or 'single file'})"),
        ("tensors", f"{s['tensors']}  " + ", ".join(f"{d}: {c}" for d, c in s["dtypes"].items())),
        ("layers", f"{len(s['layers'])}" + (f"  ({s['layers'][0]}..{s['layers'][-1]})" if s["layers"] else "")),
        ("MTP layers", ", ".join(s["mtp_layers"]) or "none"),
    ]
    per_layer = Counter(s["experts_per_layer"].values())
    rows.append(("experts / layer", ", ".join(f"{e} x{plural(c, 'layer')}" for e, c in sorted(per_layer.items())) or "none"))
    p = s["projections"]
    rows.append(("FP4 projections", f"{p['total']}  " + ", ".join(f"{r}: {c}" for r, c in p["by_role"].items())
                 + "  [" + ", ".join(f"{q}: {c}" for q, c in p["by_quant"].items()) + "]"))
    for role, entries in s["shapes_by_role"].items():
        for e in entries:
            rows.append((f"  {role}", f"{e['quant']} N={e['n']} K={e['k']}: {e['tensors']}  x{e['count']}"))
    declared = s["declared_group_size"]
    sizes = ", ".join(map(str, s["group_sizes"])) or "-"
    rows.append(("group size", sizes + (f" (declared {declared})" if declared else "")))
    b = s["bytes"]
    sizes = (f"FP4 experts {human_size(b['fp4_experts'])}, other FP4 layers {human_size(b['fp4_other'])}, FP8 {human_size(b['fp8'])}, BF16 {human_size(b['bf16'])}, "
             f"other {human_size(b['other'])}; total {human_size(b['total'])}")
    rows.append(("bytes", sizes))
    rows.append(("quantization", ", ".join(f"{k}={v}" for k, v in s["quantization_config"].items()) or "none"))
    if s["hf_quant_config"] is not None:
        rows.append(("hf_quant_config", ", ".join(f"{k}={v}" for k, v in s["hf_quant_config"].items())))
    for ex in s["excluded_modules"]:
        rows.append(("excluded", f"{', '.join(ex['modules'])}  ({ex['source']})"))
    if not s["excluded_modules"]:
        rows.append(("excluded", "none declared"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@click.command(help="Show what a checkpoint holds (format, layers, experts, dtypes, bytes), reading only "
                    "config files and safetensors headers. PATH is a checkpoint directory or a Hugging "
                    "Face repo id." + EXAMPLES)
@click.argument("path")
@report_options
def inspect(path: str, as_json: bool, report_file: str | None, quiet: bool) -> None:
    summary = summarize(open_checkpoint(path))  # JSON schema: docs/INSPECT.md
    emit(summary, render_table(summary), as_json=as_json, report_file=report_file, quiet=False)
