"""Session-wide fixtures. Helpers (assert_bytes_equal, run_cli, ...) live in tests/helpers/, imported
as `tests.helpers.<module>`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import settings

from dsv4_convert.synth import write_synthetic_checkpoint

pytest.register_assert_rewrite("tests.helpers")  # before they are imported: their asserts explain themselves

from tests.helpers import cli  # noqa: E402 (after the rewrite hook)

# Substitution: the converter refuses model families the plugins do not serve yet (convert.unservable_family).
# The generic synthetic formats carry a DeepseekV3ForCausalLM config, so every CLI run here would be refused;
# the tests of the converter itself convert them anyway, through the flag's documented environment variable.
# tests/convert/test_families.py checks the refusal with the variable removed.
os.environ.setdefault("DSV4_CONVERT_ALLOW_UNSERVABLE", "1")


# Hypothesis' default per-example deadline (200 ms) is a wall-clock assert: on a loaded CI machine it
# fails good code. Tests that want a hang guard set a generous one of their own.
settings.register_profile("dsv4", deadline=None)
settings.load_profile("dsv4")


# The fast loop (`pytest -m "not slow"`, CONTRIBUTING.md) leaves out the tests marked slow. A new
# slow test marks itself (`pytestmark = pytest.mark.slow` for a file, `@pytest.mark.slow` for one
# test); this list marks the files (or single tests: node-id prefixes) measured slow before the
# marker existed, so their files need no edit: each starts the CLI or an interpreter, or takes over a
# second (`--durations`, measured on the 2-core machine).
SLOW = (
    "tests/cli/",
    "tests/convert/test_convert_e2e.py", "tests/convert/test_convert_faults.py", "tests/convert/test_cpu_route.py",
    "tests/convert/test_golden_cli.py", "tests/convert/test_padded_convert.py",
    "tests/convert/test_padded_real_shapes.py", "tests/convert/test_padded_reverse_validate.py",
    "tests/convert/test_real_shapes.py", "tests/convert/test_shard_stability.py",
    "tests/convert/test_writeback_profile.py",
    "tests/convert/test_families.py::test_source_validates_clean",
    "tests/convert/test_families.py::test_converted_output_validates_and_reverses",
    "tests/convert/test_families.py::test_unservable_family_is_refused_with_the_reason",
    "tests/core/test_reader.py::test_hub_",  # each opens a hub cache in a fresh interpreter
    "tests/core/test_reader.py::test_original_and_metal_are_left_out_and_not_copied",
    "tests/gpu/",
    "tests/reliability/test_fuzz_parsers.py::test_fuzz[",
    "tests/reliability/test_catalogue.py", "tests/reliability/test_clear_errors.py",
    "tests/reliability/test_cli_vocabulary.py", "tests/reliability/test_integrity.py", "tests/reliability/test_paths.py",
    "tests/reliability/test_read_only_input.py", "tests/reliability/test_rules.py",
    "tests/runtime/test_direct_io.py", "tests/runtime/test_executor_seam.py", "tests/runtime/test_ray_executor.py",
    "tests/serving/test_plan_arithmetic.py",
    "tests/synth/test_synth.py::test_cli_writes_and_refuses_existing",
    "tests/test_no_engine_import.py",
    "tests/validate/test_cli_validate.py", "tests/validate/test_kernel_cpu.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """run_cli warns when a test not marked slow starts the CLI (its fixtures' setup included)."""
    cli.UNMARKED_TEST = None if item.get_closest_marker("slow") else item.nodeid


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


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: pytest starts without xdist too (then in one process)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command): one worker per core this process may use, at most 8 (each worker
    imports torch and builds its own session fixtures; the CLI tests start more processes anyway)."""
    return max(1, min(len(os.sched_getaffinity(0)), 8))
