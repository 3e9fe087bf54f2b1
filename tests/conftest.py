"""Shared test helpers. Keep this the only conftest.py: tests import `assert_bytes_equal` from it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from dsv4_convert.synth import write_synthetic_checkpoint

# Substitution: the converter refuses model families the plugins do not serve yet (convert.unservable_family).
# The generic synthetic formats carry a DeepseekV3ForCausalLM config, so every CLI run here would be refused;
# the tests of the converter itself convert them anyway, through the flag's documented environment variable.
# tests/convert/test_families.py checks the refusal with the variable removed.
os.environ.setdefault("DSV4_CONVERT_ALLOW_UNSERVABLE", "1")


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


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="session")
def synth_source(tmp_path_factory):
    """synth_source(fmt, **kwargs) -> a read-only synthetic checkpoint, cached by its arguments.
    Read-only proves that no command ever writes into its input (root ignores the bits, so the
    tests also compare hashes)."""
    cache: dict = {}

    def make(fmt: str, **kwargs) -> Path:
        key = (fmt, tuple(sorted(kwargs.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp("src") / fmt
            write_synthetic_checkpoint(out, format=fmt, **kwargs)
            _read_only(out)
            cache[key] = out
        return cache[key]

    yield make
    for root in cache.values():
        for p in [root, *root.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
