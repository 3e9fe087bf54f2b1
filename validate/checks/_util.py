"""Small helpers the checks share: counting a boolean mask and naming its first hit."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["count_first", "fmt_coords", "roles_text"]


def count_first(mask) -> tuple[int, tuple[int, ...] | None]:
    """(number of True entries, coordinates of the first one) of a bool numpy array or torch tensor."""
    if isinstance(mask, torch.Tensor):
        mask = mask.numpy()
    if not mask.any():
        return 0, None
    flat = mask.reshape(-1)
    count = int(np.count_nonzero(flat))
    i = int(np.argmax(flat))
    coords = []
    for size in reversed(mask.shape):
        coords.append(i % size)
        i //= size
    return count, tuple(reversed(coords))


def fmt_coords(c: tuple[int, ...] | None) -> str:
    return "[" + ", ".join(str(x) for x in c) + "]" if c is not None else "-"


def roles_text(roles) -> str:
    return ", ".join(getattr(r, "value", str(r)) for r in roles)
