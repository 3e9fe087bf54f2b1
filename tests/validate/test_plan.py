"""plan on DeepSeek-V4-Flash-shaped headers (a Checkpoint built directly: real shapes, no files)."""

from pathlib import Path

import pytest

from dsv4_convert.core.tensor_model import Checkpoint, Projection, Quant, Role, SourceFormat, TensorRef
from dsv4_convert.validate.plan import make_plan, shape_from_checkpoint
from dsv4_convert.validate.tiles import moe_shard_verdict

GIB = 1 << 30


def flash_like(*, layers=43, experts=256, hidden=4096, inter=2048, other_gib=11.6) -> Checkpoint:
    tensors, projections = {}, []
    for layer in range(layers):
        for e in range(experts):
            for role, w, (n, k) in ((Role.GATE, "w1", (inter, hidden)), (Role.UP, "w3", (inter, hidden)),
                                    (Role.DOWN, "w2", (hidden, inter))):
                key = f"layers.{layer}.ffn.experts.{e}.{w}"
                wt = TensorRef(f"{key}.weight", "s", "I8", (n, k // 2), 0, n * k // 2)
                sc = TensorRef(f"{key}.scale", "s", "F8_E8M0", (n, k // 32), 0, n * k // 32)
                tensors[wt.name], tensors[sc.name] = wt, sc
                projections.append(Projection(key, str(layer), e, role, Quant.MXFP4, n, k, wt, sc))
    other = TensorRef("embed.weight", "s", "BF16", (1,), 0, int(other_gib * GIB))
    tensors[other.name] = other
    config = {"hidden_size": hidden, "moe_intermediate_size": inter, "n_routed_experts": experts,
              "num_hidden_layers": layers, "expert_dtype": "fp4"}
    return Checkpoint(Path("DeepSeek-V4-Flash"), SourceFormat.MXFP4_DSV4, config, None, tensors, tuple(projections))


@pytest.fixture(scope="module")
def flash():
    return shape_from_checkpoint(flash_like())


def test_flash_shape_from_headers(flash):
    assert (flash.hidden, flash.intermediate, flash.experts, flash.layers, flash.quant) == (4096, 2048, 256, 43, "mxfp4")
    assert 136 < flash.expert_bytes / GIB < 138


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_flash_verdicts_tp_1_2_4_8(flash, engine):
    plan = make_plan(flash, gpus=8, gpu_mem_gib=96, engine=engine)
    by = {(c.tp, c.ep): c for c in plan.candidates}
    assert all(by[(tp, 1)].tiles.ok for tp in (1, 2, 4, 8))  # I/TP = 2048..256, all multiples of 128
    assert not by[(1, 1)].fits and "do not fit" in by[(1, 1)].reasons[0]
    assert by[(2, 1)].valid and by[(4, 1)].valid and by[(8, 1)].valid
    assert (plan.chosen.tp, plan.chosen.ep) == (8, 1)
    flag = "--moe-runner-backend marlin" if engine == "sglang" else "--moe-backend marlin"
    assert flag in plan.command and "SM100" in plan.backend_why
    assert ("--mem-fraction-static" if engine == "sglang" else "--gpu-memory-utilization") in plan.command
    assert plan.to_json()["recommended"] == {"tp": 8, "ep": 1}


def test_shape_that_breaks_the_tile_rule_at_tp8_is_flagged():
    shape = shape_from_checkpoint(flash_like(layers=1, experts=8, inter=768))  # I/8 = 96: w2 K=96 breaks it
    plan = make_plan(shape, gpus=8, gpu_mem_gib=96, engine="sglang")
    by = {(c.tp, c.ep): c for c in plan.candidates}
    assert by[(4, 1)].tiles.ok  # I/4 = 192: w13 [384, 4096], w2 [4096, 192] (N%128, K%64)
    bad = by[(8, 1)]
    assert not bad.valid and not bad.tiles.ok and "w2 shard N=H=4096, K=I_shard=96" in bad.reasons[0]
    assert (plan.chosen.tp, plan.chosen.ep) == (8, 8)  # EP keeps experts whole


def test_padding_engine_is_named():
    v = moe_shard_verdict(hidden=2880, intermediate=2880, experts=128, group=32, quant="mxfp4", tp=2, ep=1,
                          engine="vllm")  # gpt-oss-120b: H = 2880 is not a multiple of 128
    assert v.servable and not v.ok and "vLLM's Mxfp4MoEMethod rounds I -> 1536 and H -> 3072" in v.padding
    v = moe_shard_verdict(hidden=4096, intermediate=768, experts=8, group=16, quant="nvfp4", tp=8, ep=1,
                          engine="sglang")
    assert not v.servable and "SGLang does not pad" in v.padding
    v = moe_shard_verdict(hidden=4096, intermediate=2048, experts=256, group=32, quant="mxfp4", tp=128, ep=1,
                          engine="sglang")
    assert not v.servable and "straddle" in v.problems[0]
