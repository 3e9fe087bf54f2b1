"""A source checkpoint against a reference source (`--against` on an unconverted checkpoint): the
same projection must hold the same bytes; on a mismatch, name the likely cause."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..check import Finding, Scope, Severity, check
from ..diagnose import swap_nibbles
from ..inputs import Options, ProjectionTensors
from ._util import count_first

__all__ = ["same_as_reference"]


def _cause(src: torch.Tensor, ref: torch.Tensor) -> str:
    if torch.equal(swap_nibbles(src), ref):
        return "swapped nibbles: the even k element sits in the high nibble"
    return "unknown: the codes differ"


@check(id="against.mismatch", severity=Severity.ERROR, scope=Scope.AGAINST,
       hint="re-copy or re-export this projection from the reference checkpoint")
def same_as_reference(pair: tuple[ProjectionTensors, ProjectionTensors], opts: Options) -> Iterator[Finding]:
    """A copy that differs from its reference serves different weights than the ones that were evaluated."""
    p, ref = pair
    where = dict(file=p.file, layer=p.proj.layer, expert=p.proj.expert)
    a, b = p.weight.view(torch.uint8), ref.weight.view(torch.uint8)
    if a.shape != b.shape:
        yield Finding(p.proj.weight.name, f"codes {list(a.shape)}, reference {list(b.shape)}.", cause="shape", **where)
        return
    count, first = count_first(a != b)
    if count:
        cause = _cause(a, b)
        yield Finding(p.proj.weight.name, f"{count} of {a.numel()} code bytes differ from the reference; first at "
                      f"[n={first[0]}, k={2 * first[1]}..{2 * first[1] + 1}] ({int(a[first]):#04x} != "
                      f"{int(b[first]):#04x}). Likely cause: {cause}.", count=count, first=first, cause=cause, **where)
    sa, sb = p.scale_bytes, ref.scale_bytes
    count, first = count_first(sa != sb) if sa.shape == sb.shape else (sa.numel(), None)
    if count:
        yield Finding(p.scale_name, f"{count} block scale bytes differ from the reference"
                      + (f"; first at [{first[0]}, {first[1]}]." if first else " (shapes differ)."), count=count,
                      first=first, cause="scales", **where)
    ga, gb = p.global_scale, ref.global_scale
    if (ga is None) != (gb is None) or (ga is not None and not torch.equal(
            ga.float().reshape(-1).view(torch.int32), gb.float().reshape(-1).view(torch.int32))):
        yield Finding(p.proj.key, f"global scale {None if ga is None else ga.tolist()} != reference "
                      f"{None if gb is None else gb.tolist()}.", cause="global", **where)
