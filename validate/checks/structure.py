"""Index, headers, experts, dtypes and shapes, from headers and config alone (no tensor data)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from ...core.checkpoint.dtypes import SCALE_DTYPES, WEIGHT_DTYPES
from ...core.checkpoint.index import unsafe_shard_paths
from ...core.files import INDEX_FILE
from ...core.sources import structure as rules
from ...core.sources.families import outside_index_note
from ...core.sources.structure import model_dims
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options

__all__ = [
    "dtype_shape",
    "expert_dims",
    "experts_empty",
    "experts_extra",
    "experts_input_scale",
    "experts_missing",
    "experts_scheme",
    "head_present",
    "index_extra_file",
    "index_keys",
    "index_missing_file",
    "k_alignment",
    "model_dims",
    "reader_refused",
    "shard_headers",
    "shard_truncated",
]



@check(id="structure.shard.header", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="re-download the shard; a header that does not parse or whose offsets are inconsistent is corrupt")
def shard_headers(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A corrupt header means the engine cannot load the shard, or loads the wrong bytes as a tensor."""
    for h in c.headers.values():
        if h.error:
            yield Finding(h.file, h.error, file=h.file)


@check(id="structure.shard.truncated", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="re-download the shard (compare its size with the hub's); an interrupted copy leaves it short")
def shard_truncated(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A shard shorter than its header says holds only part of its tensors."""
    for h in c.headers.values():
        ends = [(end, name) for name, (_, _, _, end) in h.tensors.items()]
        if ends:
            end = max(ends)[0]
            if end > h.size:
                cut = [n for n, (_, _, b, e) in h.tensors.items() if e > h.size]
                yield Finding(h.file, f"file is {h.size} bytes but its header needs {end}: {len(cut)} tensors are "
                              f"cut off, first {min(cut)}.", count=len(cut), file=h.file)


@check(id="structure.index.missing_file", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="download the missing shard(s); the index lists them but they are not in the directory")
def index_missing_file(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Tensors the index puts in a file that does not exist cannot be loaded."""
    if c.index is None:
        return
    by_file = defaultdict(list)
    outside = set(unsafe_shard_paths(c.index["weight_map"].values()))  # never opened: the reader refuses them
    for name, f in c.index["weight_map"].items():
        if f not in c.headers and f not in outside:
            by_file[f].append(name)
    for f, names in sorted(by_file.items()):
        yield Finding(INDEX_FILE, f"{len(names)} tensors are mapped to {f}, which does not exist (first "
                      f"{min(names)}).", count=len(names), file=f)


@check(id="structure.index.keys", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="rebuild model.safetensors.index.json from the shard headers")
def index_keys(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Every tensor must be in exactly one shard and the index must say which, or loaders pick the wrong one or none."""
    if c.index_error:
        yield Finding(INDEX_FILE, c.index_error)
        return
    owners = defaultdict(list)
    for h in c.headers.values():
        for name in h.tensors:
            owners[name].append(h.file)
    dup = {n: fs for n, fs in owners.items() if len(fs) > 1}
    if dup:
        n = min(dup)
        yield Finding(n, f"{len(dup)} tensors appear in more than one shard; first {n} in {', '.join(dup[n])}.",
                      count=len(dup))
    if c.index is None:
        return
    wmap = c.index["weight_map"]
    wrong = [(n, f) for n, f in wmap.items()  # a shard whose header failed has its own finding (shard.header)
             if f in c.headers and not c.headers[f].error and n not in c.headers[f].tensors]
    if wrong:
        n, f = min(wrong)
        yield Finding(n, f"{len(wrong)} index entries point to a shard that does not hold the tensor; first {n} "
                      f"-> {f}.", count=len(wrong), file=f)
    indexed = set(wmap.values())  # a whole file outside the index is structure.index.extra_file's finding
    extra = sorted(n for n, fs in owners.items() if n not in wmap and any(f in indexed for f in fs))
    if extra:
        yield Finding(extra[0], f"{len(extra)} tensors are in shard headers but not in the index; first {extra[0]} "
                      f"({owners[extra[0]][0]}).", count=len(extra), file=owners[extra[0]][0])


@check(id="structure.index.extra_file", severity=Severity.WARNING, scope=Scope.CHECKPOINT,
       hint="if the release ships it this way, nothing to do (dsv4-convert copies it unchanged); if it is left "
            "from another download, compare it with the release's file list")
def index_extra_file(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A .safetensors file the index does not list is not loaded by the index; some releases ship one on purpose."""
    if c.index is None:
        return
    used = set(c.index["weight_map"].values())
    for f in c.files_on_disk:
        if f in used:
            continue
        note = outside_index_note(c.config, f)
        if note:  # the family ships it so (GLM's mtp.safetensors): a fact, not a problem
            yield Finding(f, f"not listed in the index: {note}; copied unchanged.", file=f, severity=Severity.INFO)
        else:
            yield Finding(f, "this .safetensors file is not listed in the index, so engines that load by the index "
                          "skip it; it is copied unchanged.", file=f)


@check(id="structure.reader", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="see the reader's message; the tensor-level checks were skipped")
def reader_refused(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """If the reader refuses the checkpoint, so will an engine; nothing else can be checked."""
    e = c.reader_error
    if e is not None:
        yield Finding(getattr(e, "tensor", None) or str(c.root), f"the reader refused the checkpoint "
                      f"[{getattr(e, 'error_id', type(e).__name__)}]: {getattr(e, 'message', e)}",
                      file=getattr(e, "file", None))


def _findings(rule: rules.Rule, c: CheckpointInput) -> Iterator[Finding]:
    """The shared rule's violations (core/sources/structure.py: the converter refuses the same ones) as findings."""
    if c.checkpoint is None:
        return
    for v in rule(c.checkpoint):
        yield Finding(v.tensor, v.message, count=v.count, file=v.file, layer=v.layer, expert=v.expert)


_RULE = {r.check_id: r for r in rules.RULES}


@check(id="structure.experts.empty", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint=_RULE["structure.experts.empty"].hint)
def experts_empty(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A projection with 0 rows or columns holds no expert: the engine's fused tensor cannot take it."""
    yield from _findings(_RULE["structure.experts.empty"], c)


@check(id="structure.experts.missing", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint=_RULE["structure.experts.missing"].hint)
def experts_missing(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The engine allocates n_routed_experts per layer; a missing expert fails the load or serves zeros."""
    yield from _findings(_RULE["structure.experts.missing"], c)


@check(id="structure.experts.extra", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint=_RULE["structure.experts.extra"].hint)
def experts_extra(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Experts numbered n_routed_experts or more have no slot in the engine's stacked tensors."""
    yield from _findings(_RULE["structure.experts.extra"], c)


@check(id="structure.experts.dims", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint=_RULE["structure.experts.dims"].hint)
def expert_dims(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Every projection's [N, K] must match hidden_size / moe_intermediate_size, or it reads as another matrix."""
    yield from _findings(_RULE["structure.experts.dims"], c)


@check(id="structure.experts.scheme", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint=_RULE["structure.experts.scheme"].hint)
def experts_scheme(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Experts outside the family's experts module have no place in the engine's weight-name mapping."""
    yield from _findings(_RULE["structure.experts.scheme"], c)


@check(id="structure.head", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint=_RULE["structure.head"].hint)
def head_present(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """An untied model (tie_word_embeddings: false) needs its own output head tensor."""
    yield from _findings(_RULE["structure.head"], c)


@check(id="structure.experts.input_scale", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint=_RULE["structure.experts.input_scale"].hint)
def experts_input_scale(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Input scales come for every NVFP4 expert projection or for none; a partial set means tensors were lost."""
    yield from _findings(_RULE["structure.experts.input_scale"], c)


@check(id="structure.dtype_shape", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="the checkpoint was exported with another config or tool version; re-export it consistently")
def dtype_shape(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Every projection must have the dtypes and packed shapes of its format, or the engine's fused tensors cannot hold it."""
    if c.checkpoint is None:
        return
    marlin = c.checkpoint.format.converted
    problems = defaultdict(list)
    for p in c.checkpoint.projections:  # [N, K] against the config: structure.experts.dims
        if marlin or p.row_step != 1 or p.expert_index is not None:
            continue  # Marlin tensors: marlin.dtype_shape; stacked gpt-oss tensors: checked by the reader
        g = p.group_size
        if p.weight.dtype not in WEIGHT_DTYPES or p.weight.shape[-2:] != (p.n, p.k // 2):
            problems[f"{p.role.value} weight: {p.weight.dtype} {list(p.weight.shape)}, expected {'/'.join(WEIGHT_DTYPES)} "
                     f"[{p.n}, {p.k // 2}]"].append(p)
        if p.scale.dtype not in SCALE_DTYPES[p.quant.value] or p.scale.shape[-2:] != (p.n, p.k // g):
            problems[f"{p.role.value} scale: {p.scale.dtype} {list(p.scale.shape)}, expected "
                     f"{'/'.join(SCALE_DTYPES[p.quant.value])} [{p.n}, {p.k // g}] (group {g})"].append(p)
        if p.global_scale is not None and p.global_scale.dtype != "F32":
            problems[f"{p.role.value} global: {p.global_scale.dtype}, expected F32"].append(p)
    for text, ps in problems.items():
        yield Finding(ps[0].weight.name, f"{len(ps)} projections: {text}; first {ps[0].key}.", count=len(ps),
                      file=ps[0].weight.file, layer=ps[0].layer, expert=ps[0].expert)


@check(id="structure.k_align", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="this shape cannot be served by Marlin; pad K to a multiple of 8 and of the group size when quantizing")
def k_alignment(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Marlin views the packed bytes as int32 (K % 8) and infers the group size as K / scale rows (K % g)."""
    if c.checkpoint is None:
        return
    seen = set()
    for p in c.checkpoint.projections:
        bad = [f"K % 8 = {p.k % 8}"] if p.k % 8 else []
        if p.k % p.group_size:
            bad.append(f"K % {p.group_size} = {p.k % p.group_size}")
        if bad and (p.role, p.k) not in seen:
            seen.add((p.role, p.k))
            yield Finding(p.weight.name, f"K={p.k}: {', '.join(bad)}.", file=p.weight.file, layer=p.layer,
                          expert=p.expert)
