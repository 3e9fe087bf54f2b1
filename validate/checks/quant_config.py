"""config.json / hf_quant_config.json against the tensors: group size, which method loads which
experts (MTP experts in particular), exclusions, and this tool's own `marlin_fp4` block."""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

from ...core.checkpoint.tensor_model import Quant
from ...core.files import CONFIG, HF_QUANT_CONFIG
from ...core.record.converted_config import ConvertedConfigError, converted_record, record_or_none
from ...core.record.converted_rules import EXPERTS_MAP, model_config_problems
from ...core.targets.engines import mxfp4_dtype_problem
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options
from .tiles import containers

__all__ = [
    "declared_group_sizes",
    "exclusions_cover",
    "experts_method",
    "group_size_matches",
    "marlin_config",
    "marlin_dtype_shape",
    "moe_quant_algo_matches",
    "mxfp4_act_dtype",
    "quantized_layers_match",
]

_FLOAT = {"BF16", "F16", "F32"}


def _qc(c: CheckpointInput) -> dict:
    return c.config.get("quantization_config") or {}


def _hfq(c: CheckpointInput) -> dict:
    return (c.hf_quant_config or {}).get("quantization") or {}


def declared_group_sizes(c: CheckpointInput) -> list[tuple[str, int]]:
    """Every place the config files declare the FP4 group size: engines read different ones."""
    qc, hq = _qc(c), _hfq(c)
    found = [(where, v) for where, v in (("hf_quant_config.json quantization.group_size", hq.get("group_size")),
                                         ("config.json quantization_config.group_size", qc.get("group_size")))]
    for name, group in (qc.get("config_groups") or {}).items():
        if isinstance(group, dict):
            found.append((f"config.json quantization_config.config_groups.{name}.weights.group_size",
                          (group.get("weights") or {}).get("group_size")))
    return [(where, v) for where, v in found if isinstance(v, int) and not isinstance(v, bool)]


def _tensor_group(p) -> int | None:
    return p.k // p.k_blocks if p.k_blocks else None


def exclusion_patterns(c: CheckpointInput) -> list[str]:
    qc, hq = _qc(c), _hfq(c)
    pats = []
    # `ignored_layers`: the mxfp8 blocks of MiniMax-M3.1 (vLLM 0.34 ModelOptMxFp8Config.from_config, SGLang 0.5.23 Fp8Config)
    for v in (hq.get("exclude_modules"), qc.get("exclude_modules"), qc.get("ignore"), qc.get("modules_to_not_convert"),
              qc.get("ignored_layers")):
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
    if c.checkpoint is None or c.checkpoint.format.converted:
        return
    routed = c.checkpoint.routed_quant  # the global group size describes the routed experts (not MXFP4 MTP)
    found = defaultdict(list)
    for p in c.checkpoint.projections:
        found[(p.quant.value, _tensor_group(p))].append(p)
    for (quant, g), ps in found.items():
        if g != ps[0].group_size:
            yield Finding(ps[0].scale.name, f"{len(ps)} {quant} projections have K / scale columns = {g}, but "
                          f"{quant} needs {ps[0].group_size}.", count=len(ps), file=ps[0].scale.file)
            continue
        if routed is None or quant != routed.value:
            continue
        for where, declared in declared_group_sizes(c):
            if declared != g:
                yield Finding(where, f"{where} = {declared}, but the {quant} expert scales have groups of {g} "
                              f"(first {ps[0].scale.name}).", count=len(ps), file=where.split(" ")[0])


_ALGO = {"NVFP4": "nvfp4", "MXFP4": "mxfp4"}


def quantized_layer_entries(c: CheckpointInput) -> list[tuple[str, str, dict]]:
    """(file, module prefix, {quant_algo, group_size}) of every per-layer `quantized_layers` entry (ModelOpt MIXED_PRECISION)."""
    out = []
    for where, block in ((CONFIG, _qc(c)), (HF_QUANT_CONFIG, _hfq(c))):
        layers = block.get("quantized_layers")
        if isinstance(layers, dict):
            out += [(where, name, entry) for name, entry in layers.items() if isinstance(entry, dict)]
    return out


def _covered(prefix: str, container: str) -> bool:
    variants = {container, "model." + container, container.removeprefix("model.")}
    return any(v == prefix or v.startswith(prefix + ".") for v in variants)


@check(id="structure.quant_config.layers", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="make each quantized_layers entry say the quant_algo and group_size of its experts' tensors "
            "(NVFP4: 16, MXFP4: 32), in config.json and hf_quant_config.json alike")
def quantized_layers_match(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """ModelOpt's MIXED_PRECISION engines build each layer's parameters from its quantized_layers entry; one that contradicts the tensors fails the load or reads scales as the wrong format."""
    if c.checkpoint is None or c.checkpoint.format.converted:
        return
    by_container = defaultdict(list)
    for p in c.checkpoint.projections:
        by_container[p.container].append(p)
    for where, prefix, entry in quantized_layer_entries(c):
        for container, ps in by_container.items():
            if not _covered(prefix, container):
                continue
            quant, g = ps[0].quant.value, _tensor_group(ps[0])
            algo = str(entry.get("quant_algo", "")).upper()
            if algo in _ALGO and _ALGO[algo] != quant:
                yield Finding(f"quantized_layers.{prefix}", f"{where}: quantized_layers[{prefix!r}].quant_algo = "
                              f"{entry.get('quant_algo')}, but {container} holds {quant} tensors (first "
                              f"{ps[0].scale.name}).", file=where, layer=ps[0].layer)
            gs = entry.get("group_size")
            if isinstance(gs, int) and g is not None and gs != g:
                yield Finding(f"quantized_layers.{prefix}", f"{where}: quantized_layers[{prefix!r}].group_size = "
                              f"{gs}, but {container}'s scales have groups of {g} (first {ps[0].scale.name}).",
                              file=where, layer=ps[0].layer)


@check(id="structure.quant_config.moe_algo", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="set moe_quant_algo to the format of the routed experts' tensors (NVFP4 for E4M3 scales per 16, "
            "MXFP4 for E8M0 scales per 32)")
def moe_quant_algo_matches(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """SGLang and vLLM pick the MoE method of a DeepSeek-V4 checkpoint from moe_quant_algo; the wrong one builds scale parameters of the other FP4 format."""
    if c.checkpoint is None or c.checkpoint.format.converted:
        return
    declared = str(_qc(c).get("moe_quant_algo") or "").upper()
    routed = c.checkpoint.routed_quant
    if declared in _ALGO and routed is not None and _ALGO[declared] != routed.value:
        first = next(p for p in c.checkpoint.projections if p.quant is routed and not p.layer.startswith("mtp"))
        yield Finding(CONFIG, f"quantization_config.moe_quant_algo = {_qc(c)['moe_quant_algo']}, but the "
                      f"routed experts are {routed.value} (first {first.scale.name}: {first.scale.dtype}, groups of "
                      f"{_tensor_group(first)}).", file=CONFIG)


@check(id="structure.quant_config.method", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="exclude the MXFP4 (MTP) experts from the NVFP4 method (exclude_modules: ['mtp*']), or "
            "re-export those experts in the configured format")
def experts_method(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Each experts block must be loaded by the method that matches its format; NVFP4 params built for MXFP4 MTP experts fail or load garbage."""
    if c.checkpoint is None:
        return
    qc, fmt = _qc(c), c.checkpoint.format
    record = record_or_none(c.config) if fmt.converted else None
    if fmt.converted and record is None:
        return  # the block does not parse: marlin.config names every problem
    pats = exclusion_patterns(c)
    for name, info in containers(c).items():
        actual = info["quant"]
        if record is not None:
            declared = record.experts.get(name)
            if declared is None:
                yield Finding(name, f"[{EXPERTS_MAP}] holds Marlin-packed {actual} experts, but "
                              "quantization_config.experts does not list it: the plugins would serve it with the "
                              "engine's own method, which misreads Marlin tensors.", layer=info["layer"])
            elif declared != actual:
                yield Finding(name, f"quantization_config.experts says {declared}, the tensors are {actual}.",
                              layer=info["layer"])
            continue
        method = Quant.NVFP4 if str(qc.get("moe_quant_algo", "")).upper() == "NVFP4" else fmt.moe_method
        if method is Quant.NVFP4:
            expected = "mxfp4" if is_excluded(name, pats) else "nvfp4"
            why = "excluded from" if expected == "mxfp4" else "not excluded from"
        elif method is Quant.MXFP4:
            expected, why = "mxfp4", "loaded by"
        else:
            continue
        if expected != actual:
            yield Finding(name, f"experts are {actual} but {why} the {method.value.upper()} MoE method "
                          f"({fmt.value}), so the engine "
                          f"loads them as {expected}.", layer=info["layer"])


@check(id="structure.quant_config.exclusions", severity=Severity.WARNING, scope=Scope.CHECKPOINT,
       hint="add these modules to exclude_modules / ignore in the quantization config")
def exclusions_cover(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A generic NVFP4 config quantizes every linear it does not exclude; a 16-bit weight there fails to load."""
    if c.checkpoint is None or not c.checkpoint.format.every_linear:
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
    if c.checkpoint is not None and mxfp4_dtype_problem(opts.target.act_dtype):
        n = sum(1 for p in c.checkpoint.projections if p.quant.value == "mxfp4")
        if n:
            yield Finding("config", f"{n} MXFP4 projections, activation dtype {opts.target.act_dtype}.", count=n)


@check(id="marlin.config", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="validate with the --target / --act-dtype the checkpoint was converted for, or re-convert it")
def marlin_config(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A converted checkpoint is only right for the engine and activation dtype it was converted for (docs/FORMAT.md)."""
    if c.checkpoint is None or not c.checkpoint.format.converted:
        return
    record = None
    try:  # the one parser the plugins use: what it refuses, the engine refuses at launch
        record = converted_record(c.config)
    except ConvertedConfigError as e:
        for p in e.problems:
            yield Finding(CONFIG, f"[{p.error_id}] {p.text}.", file=CONFIG)
    for p in model_config_problems(c.config):
        yield Finding(CONFIG, f"[{p.error_id}] {p.text}: the checks that need it would be skipped.",
                      file=CONFIG)
    if record is None:
        return
    engine, tag, act = record.target_engine, record.marlin_layout, record.act_dtype
    if opts.engine_requested and opts.engine_requested != engine:
        yield Finding(CONFIG, f"converted for target {engine} ({tag}), but you asked to validate for "
                      f"{opts.engine_requested}: the {opts.engine_requested} engine would misread its scales/globals.")
    if opts.act_dtype_requested and opts.act_dtype_requested != act:
        yield Finding(CONFIG, f"converted for activation dtype {act}, but you asked for "
                      f"{opts.act_dtype_requested}: NVFP4 scale bytes and globals depend on it.")


@check(id="marlin.dtype_shape", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="re-run the conversion; a converted projection must have exactly the tensors of docs/FORMAT.md")
def marlin_dtype_shape(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The Marlin kernel infers N, K and the group size from the tensor shapes; a wrong dtype or shape is read as garbage."""
    if c.checkpoint is None or not c.checkpoint.format.converted:
        return
    record = record_or_none(c.config)
    act = record.act_dtype if record else opts.target.act_dtype
    want_global = replace(opts.target, act_dtype=act).global_dtype  # the record's dtype, as the engine keeps it
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
