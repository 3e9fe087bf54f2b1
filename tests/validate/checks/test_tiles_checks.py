"""validate/checks/tiles.py (structure.tile.tp) on a real synthetic checkpoint, per --tp / --ep.

The verdicts come from formats/tiles.py (the one tile rule, pinned against the engines in
tests/test_tile_agreement.py); here the check must turn them into findings that name the experts
container, the layer and the split. No substitutions.
"""

import pytest

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.tiles import moe_rank_tiles
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks.tiles import tile_rules_per_rank
from dsv4_convert.validate.inputs import Options
from tests.helpers.checks import on_disk, run, synth


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # I = 256: TP 1 and 2 keep I_shard a multiple of the Marlin tile; TP 8 leaves I_shard = 32
    return synth(tmp_path_factory.mktemp("t") / "ckpt", hidden=256, intermediate=256, experts=8)[0]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_split_that_keeps_the_tiles_passes(ckpt, engine):
    for tp in (1, 2):
        assert run(tile_rules_per_rank, on_disk(ckpt), Options(target=MarlinTarget(engine=engine), tp=tp)) == []


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_split_off_the_tile_names_the_container_and_the_shard(ckpt, engine):
    opts = Options(target=MarlinTarget(engine=engine), tp=8)
    verdict = moe_rank_tiles("nvfp4", ENGINES[engine].padding, hidden=256, intermediate=256, tp=8, ep=1, experts=8)
    assert not verdict.ok  # the rule's own verdict; the check must report it, with the right severity
    (f,) = run(tile_rules_per_rank, on_disk(ckpt), opts)
    want = Severity.WARNING if verdict.servable else Severity.ERROR  # a source is padded at load if servable
    assert tile_rules_per_rank.severity_of(f) is want
    assert (f.tensor, f.layer) == ("layers.0.ffn.experts", "0")
    assert f"TP 8 / EP 1 (nvfp4, H=256, I=256, I_shard={verdict.i_shard})" in f.message
    assert verdict.reason in f.message
