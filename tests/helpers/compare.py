"""Byte-exact comparison, the one every test uses: raw bytes, never floats."""

from __future__ import annotations

import torch


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "tensor") -> None:
    """Compare raw bytes (never floats: -0.0 == 0.0 and NaN != NaN both lie); report where they differ."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.contiguous().reshape(-1).view(torch.uint8)
    b = expected.contiguous().reshape(-1).view(torch.uint8)
    diff = torch.nonzero(a != b).flatten()
    if diff.numel():
        i = diff[0].item()
        raise AssertionError(f"{what}: {diff.numel()} of {a.numel()} bytes differ; first at byte {i}: "
                             f"{a[i].item():#04x} != {b[i].item():#04x}")
