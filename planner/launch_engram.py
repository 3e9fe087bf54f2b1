"""DeepSeek-V4.1's Engram tables and vision tower in `plan`'s memory model (planner/launch.py): what one GPU holds,
where the tables go (core/targets/engines.py EngramHost: the engine's default placement and how to pick the other), and the
line of reasoning that says so. Which tensors they are: core/sources/side_tables.py. `shape` is launch.py's ModelShape
(not imported: launch.py imports this module)."""

from __future__ import annotations

from ..core.targets.engines import ENGINES

__all__ = ["engram_placements", "engram_reason", "weights_per_gpu"]

GIB = 1 << 30


def weights_per_gpu(shape, tp: int, grow: float, engram_on_gpu: bool) -> float:
    """GiB of weights one GPU holds: experts and other weights / TP, the vision tower whole, the Engram tables / TP
    on the GPUs or none (host memory)."""
    sharded = shape.expert_bytes * grow + shape.other_bytes - shape.engram_bytes - shape.vision_bytes
    return (sharded / tp + shape.vision_bytes + (shape.engram_bytes / tp if engram_on_gpu else 0)) / GIB


def engram_placements(shape, engine: str, engram: str) -> list[bool | None]:
    """Engram on the GPUs (True) or in host memory (False), in the order to try: the engine's default first
    (`auto`), or the one asked for; [None] for a model without Engram tables."""
    facts = ENGINES[engine].engram
    if not shape.engram_bytes or facts is None:
        return [None]
    if engram != "auto":
        return [engram == "gpu"]
    return [not facts.default_on_host, facts.default_on_host]


def engram_reason(shape, engine: str, on_gpu: bool, tried: list) -> str:
    facts = ENGINES[engine].engram
    gib = shape.engram_bytes / GIB
    where = (f"on the GPUs, sharded over TP ({gib:.1f} GiB / TP per GPU)" if on_gpu else
             f"in pinned host memory ({gib:.1f} GiB of host RAM per TP group; the GPUs gather their rows from it)")
    default = "the engine's default" if on_gpu != facts.default_on_host else (
        f"not {ENGINES[engine].display}'s default: " + ("no split fits with them on the GPUs" if on_gpu is False
                                                         else "no split fits with them in host memory")
        if len(tried) > 1 else "as asked (--engram)")
    how = (facts.on_gpu if on_gpu else facts.on_host).format(cmd="<command>")
    vision = f"; the vision tower's {shape.vision_bytes / GIB:.2f} GiB counted whole on every GPU" if shape.vision_bytes else ""
    return f"Engram tables {gib:.1f} GiB {where}: {default} (launch: {how}){vision}"
