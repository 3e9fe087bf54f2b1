"""core/gc_pause.py: open_checkpoint runs with the garbage collector paused and gives it back as it found
it, also when it raises; large tables are frozen, small ones not. Real checkpoints by dsv4_convert.synth
(the substitution for released weights); the large case is a stand-in object with 2**14 tensors, since the
decorator reads only `.tensors` of what it returns."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from dsv4_convert.core.errors import InputError
from dsv4_convert.core.gc_pause import FREEZE_AT, builds_tables
from dsv4_convert.core.reader import open_checkpoint
from dsv4_convert.synth import write_synthetic_checkpoint


@pytest.fixture
def collector_state():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.enable() if enabled else gc.disable()


def test_open_checkpoint_pauses_the_collector_and_restores_it(tmp_path, collector_state):
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4")
    frozen = gc.get_freeze_count()
    for enabled in (True, False):
        gc.enable() if enabled else gc.disable()
        ckpt = open_checkpoint(src)
        assert gc.isenabled() is enabled and ckpt.projections
        assert gc.get_freeze_count() == frozen  # a small checkpoint: nothing frozen
        with pytest.raises(InputError):
            open_checkpoint(tmp_path / "absent")
        assert gc.isenabled() is enabled


def test_large_tables_are_frozen_and_the_collector_is_paused_while_they_are_built(collector_state):
    seen = []

    @builds_tables
    def build(n):
        seen.append(gc.isenabled())
        return SimpleNamespace(tensors=dict.fromkeys(map(str, range(n))))

    gc.enable()
    before = gc.get_freeze_count()
    build(FREEZE_AT - 1)
    assert gc.get_freeze_count() == before and gc.isenabled()
    tables = build(FREEZE_AT)
    assert gc.get_freeze_count() > before and gc.isenabled() and seen == [False, False]
    assert len(tables.tensors) == FREEZE_AT
