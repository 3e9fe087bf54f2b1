"""Session-wide fixtures. Helpers (assert_bytes_equal, run_cli, ...) live in tests/helpers/, imported
as `tests.helpers.<module>`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import settings

from dsv4_convert.synth import write_synthetic_checkpoint

pytest.register_assert_rewrite("tests.helpers")  # before any test imports them: their asserts explain themselves

# Substitution: the converter refuses model families the plugins do not serve yet (convert.unservable_family).
# The generic synthetic formats carry a DeepseekV3ForCausalLM config, so every CLI run here would be refused;
# the tests of the converter itself convert them anyway, through the flag's documented environment variable.
# tests/convert/test_families.py checks the refusal with the variable removed.
os.environ.setdefault("DSV4_CONVERT_ALLOW_UNSERVABLE", "1")


# Hypothesis' default per-example deadline (200 ms) is a wall-clock assert: on a loaded CI machine it
# fails good code. Tests that want a hang guard set a generous one of their own.
settings.register_profile("dsv4", deadline=None)
settings.load_profile("dsv4")


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
