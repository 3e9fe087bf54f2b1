"""core/checkpoint/gc_pause.py: open_checkpoint runs with the garbage collector paused and gives it back as it found
it, also when it raises, and never freezes the process's objects (gc.freeze is the program's decision, not
a library's). Real checkpoints by dsv4_convert.synth (the substitution for released weights); the large
case is a stand-in object with 2**15 tensors, since the decorator reads nothing of what it returns."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from dsv4_convert.core.checkpoint.gc_pause import builds_tables
from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.errors import InputError
from dsv4_convert.synth import write_synthetic_checkpoint


@pytest.fixture
def collector_state():
    enabled = gc.isenabled()
    yield
    gc.enable() if enabled else gc.disable()


def test_open_checkpoint_pauses_the_collector_and_restores_it(tmp_path, collector_state):
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4")
    frozen = gc.get_freeze_count()
    for enabled in (True, False):
        gc.enable() if enabled else gc.disable()
        ckpt = open_checkpoint(src)
        assert gc.isenabled() is enabled and ckpt.projections
        assert gc.get_freeze_count() == frozen
        with pytest.raises(InputError):
            open_checkpoint(tmp_path / "absent")
        assert gc.isenabled() is enabled


def test_large_tables_are_built_paused_and_not_frozen(collector_state):
    seen = []

    @builds_tables
    def build(n):
        seen.append(gc.isenabled())
        return SimpleNamespace(tensors=dict.fromkeys(map(str, range(n))))

    gc.enable()
    before = gc.get_freeze_count()
    tables = build(1 << 15)
    assert gc.get_freeze_count() == before and gc.isenabled() and seen == [False]
    assert len(tables.tensors) == 1 << 15
