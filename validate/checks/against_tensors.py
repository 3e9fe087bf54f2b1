"""`--against SRC`: every tensor that is not an FP4 expert projection (attention, norms, embeddings,
router, shared experts, FP8 blocks and their scales) must hold exactly the reference's bytes; the
expert projections are compared decoded, by against.mismatch and the Marlin round trip."""

from __future__ import annotations

from collections.abc import Iterator

from ...core.checkpoint.reader import TensorReader
from ...runtime.digest import new_hash
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options

__all__ = ["non_expert_tensors_match"]


def _projection_keys(ckpt) -> set[str]:
    return {p.key for p in ckpt.projections}


def _non_expert(ckpt) -> dict:
    keys, used = _projection_keys(ckpt), ckpt.projection_names  # used: gpt-oss's stacked *_blocks / *_scales too
    return {n: t for n, t in ckpt.tensors.items() if n.rsplit(".", 1)[0] not in keys and n not in used}


def _digest(reader: TensorReader, ref) -> str:
    h = new_hash()
    for chunk in reader.iter_bytes(ref):
        h.update(chunk)
    return h.hexdigest()


@check(id="against.tensor_mismatch", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="re-copy this tensor from the reference checkpoint, or convert again from it")
def non_expert_tensors_match(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A non-expert tensor that differs from the reference serves a different model than the one evaluated."""
    if c.against is None or c.checkpoint is None:
        return
    mine, ref = _non_expert(c.checkpoint), _non_expert(c.against)
    with TensorReader(c.checkpoint.root) as a, TensorReader(c.against.root) as b:
        for name in sorted(set(mine) | set(ref)):
            t, r = mine.get(name), ref.get(name)
            if t is None or r is None:
                side = "the reference" if t is None else "this checkpoint"
                where = (r or t).file
                yield Finding(name, f"only {side} has this tensor.", file=where, cause="missing")
            elif (t.dtype, tuple(t.shape)) != (r.dtype, tuple(r.shape)):
                yield Finding(name, f"{t.dtype}{list(t.shape)}, reference {r.dtype}{list(r.shape)}.", file=t.file,
                              cause="shape")
            elif _digest(a, t) != _digest(b, r):
                yield Finding(name, f"its {t.nbytes} bytes differ from the reference ({r.file}).", file=t.file,
                              cause="bytes")
