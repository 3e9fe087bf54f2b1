"""config.json / hf_quant_config.json against the tensors: group size, which method loads which
experts (MTP experts in particular), exclusions, and this tool's own `marlin_fp4` block."""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Iterator

from dsv4_convert.core.engines import (
    ENGINES,
    FORMAT_VERSION,
    QUANT_METHOD,
    READABLE_FORMAT_VERSIONS,
    mxfp4_dtype_problem,
)
from dsv4_convert.core.tensor_model import SourceFormat
from dsv4_convert.validate.check import Finding, Scope, Severity, check
from dsv4_convert.validate.checks.tiles import containers
from dsv4_convert.validate.inputs import CheckpointInput, Options

__all__ = [
    "exclusions_cover",
    "experts_method",
    "group_size_matches",
    "marlin_config",
    "marlin_dtype_shape",
    "mxfp4_act_dtype",
]

_FLOAT = {"BF16", "F16", "F32"}


def _qc(c: CheckpointInput) -> dict:
    return c.config.get("quantization_config") or {}


def _hfq(c: CheckpointInput) -> dict:
    return (c.hf_quant_config or {}).get("quantization") or {}


def declared_group_size(c: CheckpointInput) -> int | None:
    qc, hq = _qc(c), _hfq(c)
    for v in (hq.get("group_size"), qc.get("group_size")):
        if isinstance(v, int):
            return v
    for group in (qc.get("config_groups") or {}).values():
        v = (group.get("weights") or {}).get("group_size")
        if isinstance(v, int):
            return v
    return None


def exclusion_patterns(c: CheckpointInput) -> list[str]:
    qc, hq = _qc(c), _hfq(c)
    pats = []
    for v in (hq.get("exclude_modules"), qc.get("exclude_modules"), qc.get("ignore"), qc.get("modules_to_not_convert")):
        pats += [p for p in (v or []) if isinstance(p, str)]
    return pats


def is_excluded(name: str, patterns: list[str]) -> bool:
    """Glob match on the module name, with or without a `model.` prefix, or on any leading part of it;
    compressed-tensors `re:` patterns are regular expressions."""
    variants = {name, name.removeprefix("model."), "model." + name}
    for pat in patterns:
        if pat.startswith("re:"):
            if any(re.match(pat[3:], v) for v in variants):
                return True
            continue
        bare = pat.rstrip("*").rstrip(".")
        for v in variants:
            if fnmatch.fnmatch(v, pat) or fnmatch.fnmatch(v, pat + ".*") or (bare and (v == bare or v.startswith(bare + "."))):
                return True
    return False


@check(id="structure.quant_config.group_size", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="fix group_size in the quantization config to match the tensors (NVFP4: 16, MXFP4: 32)")
def group_size_matches(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The engine builds scale parameters from the configured group size; Marlin compiles only 16 (NVFP4) and 32 (MXFP4)."""
    if c.checkpoint is None or c.checkpoint.format is SourceFormat.MARLIN:
        return
    declared = declared_group_size(c)
    found = defaultdict(list)
    for p in c.checkpoint.projections:
        g = p.k // p.scale.shape[-1] if p.scale.shape and p.scale.shape[-1] else None
        found[(p.quant.value, g)].append(p)
    for (quant, g), ps in found.items():
        if g != ps[0].group_size:
            yield Finding(ps[0].scale.name, f"{len(ps)} {quant} projections have K / scale columns = {g}, but "
                          f"{quant} needs {ps[0].group_size}.", count=len(ps), file=ps[0].scale.file)
        elif declared is not None and quant == "nvfp4" and declared != g:
            yield Finding("quantization_config", f"declared group_size {declared}, but the NVFP4 tensors use {g} "
                          f"(first {ps[0].scale.name}).", count=len(ps))


@check(id="structure.quant_config.method", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="exclude the MXFP4 (MTP) experts from the NVFP4 method (exclude_modules: ['mtp*']), or "
            "re-export those experts in the configured format")
def experts_method(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Each experts block must be loaded by the method that matches its format; NVFP4 params built for MXFP4 MTP experts fail or load garbage."""
    if c.checkpoint is None:
        return
    qc, fmt = _qc(c), c.checkpoint.format
    pats = exclusion_patterns(c)
    for name, info in containers(c).items():
        actual = info["quant"]
        if fmt is SourceFormat.MARLIN:
            declared = (qc.get("experts") or {}).get(name)
            if declared is not None and declared != actual:
                yield Finding(name, f"quantization_config.experts says {declared}, the tensors are {actual}.",
                              layer=info["layer"])
            continue
        nvfp4_method = str(qc.get("moe_quant_algo", "")).upper() == "NVFP4" or fmt in (
            SourceFormat.NVFP4_MODELOPT_HF, SourceFormat.NVFP4_CT)
        if fmt is SourceFormat.NVFP4_MODELOPT_DSV4 or nvfp4_method:
            expected = "mxfp4" if is_excluded(name, pats) else "nvfp4"
            why = "excluded from" if expected == "mxfp4" else "not excluded from"
        elif fmt in (SourceFormat.MXFP4_DSV4, SourceFormat.MXFP4_CT, SourceFormat.MXFP4_GPTOSS):
            expected, why = "mxfp4", "loaded by"
        else:
            continue
        if expected != actual:
            yield Finding(name, f"experts are {actual} but {why} the NVFP4 MoE method ({fmt.value}), so the engine "
                          f"loads them as {expected}.", layer=info["layer"])


@check(id="structure.quant_config.exclusions", severity=Severity.WARNING, scope=Scope.CHECKPOINT,
       hint="add these modules to exclude_modules / ignore in the quantization config")
def exclusions_cover(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A generic NVFP4 config quantizes every linear it does not exclude; a 16-bit weight there fails to load."""
    if c.checkpoint is None or c.checkpoint.format not in (SourceFormat.NVFP4_MODELOPT_HF, SourceFormat.NVFP4_CT):
        return
    pats = exclusion_patterns(c)
    bad = []
    for t in c.checkpoint.passthrough:
        if t.dtype in _FLOAT and len(t.shape) == 2 and t.name.endswith(".weight"):
            module = t.name[: -len(".weight")]
            if any(s in module for s in ("norm", "embed", "lm_head", "router", ".gate")) and "proj" not in module:
                continue
            if not is_excluded(module, pats):
                bad.append(module)
    if bad:
        yield Finding(bad[0], f"{len(bad)} 16/32-bit linear weights are not excluded from the NVFP4 method; "
                      f"first {bad[0]}.", count=len(bad))


@check(id="mxfp4.act_dtype", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="serve MXFP4 experts with --act-dtype bfloat16")
def mxfp4_act_dtype(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """MXFP4 Marlin runs with bf16 activations only; SGLang's fp16 path destroys E8M0 scales outside 2**-24..2**15."""
    if c.checkpoint is not None and mxfp4_dtype_problem(opts.act_dtype):
        n = sum(1 for p in c.checkpoint.projections if p.quant.value == "mxfp4")
        if n:
            yield Finding("config", f"{n} MXFP4 projections, activation dtype {opts.act_dtype}.", count=n)


@check(id="marlin.config", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="validate with the --target / --act-dtype the checkpoint was converted for, or re-convert it")
def marlin_config(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A converted checkpoint is only right for the engine and activation dtype it was converted for (docs/FORMAT.md)."""
    if c.checkpoint is None or c.checkpoint.format is not SourceFormat.MARLIN:
        return
    qc = _qc(c)
    if qc.get("quant_method") != QUANT_METHOD or qc.get("format_version") not in READABLE_FORMAT_VERSIONS:
        yield Finding("config.json", f"quantization_config has quant_method={qc.get('quant_method')!r}, "
                      f"format_version={qc.get('format_version')!r}; expected {QUANT_METHOD!r}, "
                      f"{' or '.join(map(str, READABLE_FORMAT_VERSIONS))} (written now: {FORMAT_VERSION}).")
    engine, tag = qc.get("target_engine"), qc.get("marlin_layout")
    if engine not in ENGINES or tag != ENGINES[engine].layout_tag:
        yield Finding("config.json", f"target_engine={engine!r} with marlin_layout={tag!r}; expected one of "
                      f"{ {e: f.layout_tag for e, f in ENGINES.items()} }.")
    if opts.engine_requested and engine and opts.engine_requested != engine:
        yield Finding("config.json", f"converted for target {engine} ({tag}), but you asked to validate for "
                      f"{opts.engine_requested}: the {opts.engine_requested} engine would misread its scales/globals.")
    act = qc.get("act_dtype")
    if opts.act_dtype_requested and act and opts.act_dtype_requested != act:
        yield Finding("config.json", f"converted for activation dtype {act}, but you asked for "
                      f"{opts.act_dtype_requested}: NVFP4 scale bytes and globals depend on it.")


@check(id="marlin.dtype_shape", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="re-run the conversion; a converted projection must have exactly the tensors of docs/FORMAT.md")
def marlin_dtype_shape(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The Marlin kernel infers N, K and the group size from the tensor shapes; a wrong dtype or shape is read as garbage."""
    if c.checkpoint is None or c.checkpoint.format is not SourceFormat.MARLIN:
        return
    act = _qc(c).get("act_dtype") or opts.act_dtype
    want_global = "F32" if opts.engine == "vllm" else {"bfloat16": "BF16", "float16": "F16"}[act]
    problems = defaultdict(list)
    for p in c.checkpoint.projections:
        g = p.group_size
        if p.weight.dtype != "I32" or p.weight.shape[-2:] != (p.k // 16, 2 * p.n):
            problems[f"weight {p.weight.dtype} {list(p.weight.shape)}, expected I32 [{p.k // 16}, {2 * p.n}]"].append(p)
        sdt = "F8_E4M3" if p.quant.value == "nvfp4" else "F8_E8M0"
        if p.scale.dtype != sdt or p.scale.shape[-2:] != (p.k // g, p.n):
            problems[f"weight_scale {p.scale.dtype} {list(p.scale.shape)}, expected {sdt} [{p.k // g}, {p.n}]"].append(p)
        if p.quant.value == "nvfp4":
            mg = p.marlin_global
            if mg is None:
                problems["no weight_global_scale"].append(p)
            elif mg.dtype != want_global or mg.shape not in ((), (1,)):
                problems[f"weight_global_scale {mg.dtype} {list(mg.shape)}, expected {want_global} []"].append(p)
            if p.global_scale is None:
                problems["no kept weight_scale_2 (the conversion cannot be reversed)"].append(p)
    for text, ps in problems.items():
        yield Finding(ps[0].key, f"{len(ps)} projections: {text}; first {ps[0].key}.", count=len(ps),
                      file=ps[0].weight.file, layer=ps[0].layer, expert=ps[0].expert)
