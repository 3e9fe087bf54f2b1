"""plan on DeepSeek-V4-Flash-shaped headers (a Checkpoint built directly: real shapes, no files)."""

from pathlib import Path

import pytest

from dsv4_convert.core.checkpoint.tensor_model import Checkpoint, Projection, Quant, Role, TensorRef
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.formats.tiles import IMPOSSIBLE, PAD, moe_rank_tiles
from dsv4_convert.planner.launch import make_plan, shape_from_checkpoint

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
              "num_hidden_layers": layers, "expert_dtype": "fp4", "architectures": ["DeepseekV4ForCausalLM"],
              "model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    return Checkpoint(Path("DeepSeek-V4-Flash"), FORMATS["mxfp4-dsv4"], config, None, tensors, tuple(projections))


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


def test_shape_that_needs_padding_at_tp8_recommends_ep():
    shape = shape_from_checkpoint(flash_like(layers=1, experts=8, inter=768))  # I/8 = 96: w2 K=96 breaks it
    plan = make_plan(shape, gpus=8, gpu_mem_gib=96, engine="sglang")
    by = {(c.tp, c.ep): c for c in plan.candidates}
    assert by[(4, 1)].tiles.status == PAD  # MXFP4: I/4 = 192 is rounded to 256 by the engine
    bad = by[(8, 1)]
    assert bad.tiles.status == PAD and "I_shard 96 -> 128" in bad.reasons[0]
    assert (plan.chosen.tp, plan.chosen.ep) == (8, 8)  # EP keeps experts whole: nothing padded
    assert any("EP 8 keeps each expert whole" in r for r in plan.reasoning)
    nv = make_plan(shape_from_checkpoint(flash_like(layers=1, experts=8, inter=768)), gpus=8, gpu_mem_gib=96,
                   engine="vllm")
    assert (nv.chosen.tp, nv.chosen.ep) == (8, 8)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_reasoning_follows_a_padded_verdict(engine):
    """gpt-oss (H = I = 2880) at 8 GPUs: the engine pads H even with EP, so the plan must not claim that
    EP leaves nothing padded for a candidate it marks `pad`."""
    shape = shape_from_checkpoint(flash_like(layers=1, experts=32, hidden=2880, inter=2880))
    plan = make_plan(shape, gpus=8, gpu_mem_gib=96, engine=engine)
    chosen = plan.chosen
    assert (chosen.tp, chosen.ep, chosen.tiles.status) == (8, 8, PAD)  # H 2880 -> 3072 at every split
    assert not any("nothing is padded" in r for r in plan.reasoning), plan.reasoning
    assert any(r.startswith("TP 8 / EP 8 is padded: " + chosen.tiles.reason) for r in plan.reasoning), plan.reasoning


def test_padding_engine_is_named():
    v = moe_rank_tiles("mxfp4", ENGINES["vllm"].padding, hidden=2880, intermediate=2880, experts=128, tp=2, ep=1)  # gpt-oss-120b
    assert v.status == PAD and (v.i_pad, v.h_pad) == (1536, 3072)
    assert "vllm pads mxfp4 experts per rank: I_shard 1440 -> 1536, H 2880 -> 3072 (zeros)" == v.reason
    v = moe_rank_tiles("nvfp4", ENGINES["sglang"].padding, hidden=4096, intermediate=768, experts=8, tp=8, ep=1)
    assert v.status == IMPOSSIBLE and "sglang does not pad a gated nvfp4 MoE" in v.reason
    v = moe_rank_tiles("mxfp4", ENGINES["sglang"].padding, hidden=4096, intermediate=2048, experts=256, tp=128, ep=1)
    assert v.status == IMPOSSIBLE and "straddle" in v.reason


def test_stacked_experts_are_counted_once():
    """gpt-oss stacks all experts of a layer in one tensor that every projection of the layer refers to."""
    h = i = 2880
    blocks = TensorRef("block.0.mlp.experts.gate_up_proj_blocks", "s", "U8", (4, 2 * i, h // 32, 16), 0,
                       4 * 2 * i * h // 2)
    scales = TensorRef("block.0.mlp.experts.gate_up_proj_scales", "s", "U8", (4, 2 * i, h // 32), 0, 4 * 2 * i * h // 32)
    down = TensorRef("block.0.mlp.experts.down_proj_blocks", "s", "U8", (4, h, i // 32, 16), 0, 4 * h * i // 2)
    dscales = TensorRef("block.0.mlp.experts.down_proj_scales", "s", "U8", (4, h, i // 32), 0, 4 * h * i // 32)
    projections = []
    for e in range(4):
        key = f"block.0.mlp.experts.{e}"
        projections += [Projection(f"{key}.gate", "0", e, Role.GATE, Quant.MXFP4, i, h, blocks, scales, expert_index=e,
                                   row_step=2),
                        Projection(f"{key}.up", "0", e, Role.UP, Quant.MXFP4, i, h, blocks, scales, expert_index=e,
                                   row_start=1, row_step=2),
                        Projection(f"{key}.down", "0", e, Role.DOWN, Quant.MXFP4, h, i, down, dscales, expert_index=e)]
    tensors = {t.name: t for t in (blocks, scales, down, dscales)}
    ckpt = Checkpoint(Path("gpt-oss-layer"), FORMATS["mxfp4-gptoss"], {"num_local_experts": 4}, None, tensors,
                      tuple(projections))
    shape = shape_from_checkpoint(ckpt)
    assert shape.expert_bytes == sum(t.nbytes for t in tensors.values())  # about 53 MB, not 4 x 3 x that
    assert shape.other_bytes == 0


def test_latent_moe_experts_are_planned_at_their_own_width():
    """Nemotron-3 Super (and Kimi-K3) run the routed experts at the latent width (`moe_latent_size`,
    `routed_expert_hidden_size`), not hidden_size: the tiles and padding are computed from that width."""
    ckpt = flash_like(layers=1, experts=8, hidden=1024, inter=2688, other_gib=0.1)
    ckpt.config.update(hidden_size=4096, moe_latent_size=1024)
    assert shape_from_checkpoint(ckpt).hidden == 1024
    ckpt.config.pop("moe_latent_size")  # hidden_size alone: the width the assertion above rules out
    assert shape_from_checkpoint(ckpt).hidden == 4096
    ckpt.config.update(text_config={"routed_expert_hidden_size": 1024})
    assert shape_from_checkpoint(ckpt).hidden == 1024


def test_latent_moe_tiles_come_from_the_experts_width(tmp_path):
    """`plan` sizes the expert tiles at the width the experts have (Nemotron-3 Super: moe_latent_size), never
    hidden_size alone (core/sources/structure.py model_dims, the one home of that width)."""
    from dsv4_convert.core.checkpoint.reader import open_checkpoint
    from dsv4_convert.synth import write_synthetic_checkpoint

    root = write_synthetic_checkpoint(tmp_path / "n3s", format="nvfp4-modelopt-hf", family="nemotron-3-super",
                                      layers=2, experts=4, hidden=256, intermediate=128, shards=1)
    shape = shape_from_checkpoint(open_checkpoint(root))
    assert (shape.hidden, shape.intermediate) == (128, 128)


def _v41_like() -> Checkpoint:
    """DeepSeek-V4.1-Flash's sizes as its model page gives them: 475 GiB in all, about 189 GiB of Engram tables
    (layers.L.engram.embed.*), plus a BF16 vision tower; V4-Flash's expert shape (flash_like), the rest other weights.
    How the release splits its non-Engram bytes between experts and the rest is this test's assumption."""
    ckpt = flash_like(other_gib=475 - 137.2 - 189 - 1)
    tensors = dict(ckpt.tensors)
    for i, name in enumerate(("layers.3.engram.embed.weight", "layers.3.engram.embed.scale")):
        tensors[name] = TensorRef(name, "s", ("F8_E4M3", "F8_E8M0")[i], (1,), 0, int((189 * 32 / 33, 189 / 33)[i] * GIB))
    tensors["vision.blocks.0.mlp.w1.weight"] = TensorRef("vision.blocks.0.mlp.w1.weight", "s", "BF16", (1,), 0, GIB)
    return Checkpoint(ckpt.root, ckpt.format, ckpt.config, None, tensors, ckpt.projections)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_v41_fits_4x96_only_with_engram_in_host_memory(engine):
    shape = shape_from_checkpoint(_v41_like())
    assert round(shape.engram_bytes / GIB) == 189 and shape.vision_bytes == GIB
    assert 474 < (shape.expert_bytes + shape.other_bytes) / GIB < 476
    on_gpu = make_plan(shape, gpus=4, gpu_mem_gib=96, engine=engine, engram="gpu")
    assert on_gpu.chosen is None and on_gpu.command is None
    # auto: vLLM's default keeps the tables in host memory; SGLang's shards them over the GPUs, which does not fit,
    # so the plan moves them to host memory and says how
    auto = make_plan(shape, gpus=4, gpu_mem_gib=96, engine=engine)
    assert auto.chosen is not None and auto.chosen.tp == 4
    host = ENGINES[engine].engram.on_host.format(cmd="")
    assert host.strip() in auto.command and "pinned host memory" in "\n".join(auto.reasoning)
    # per GPU: everything but the Engram tables / 4, the vision tower whole
    assert auto.chosen.weights_gib == pytest.approx((475 - 189 - 1) / 4 + 1, abs=0.2)
    if engine == "sglang":
        assert "no split fits with them on the GPUs" in "\n".join(auto.reasoning)
    else:  # vLLM's default: nothing to add to the command
        assert "--engram-config" not in auto.command
    # on 8 GPUs the tables fit on the GPUs too: the engine's default placement stays
    eight = make_plan(shape, gpus=8, gpu_mem_gib=96, engine=engine)
    assert eight.chosen.tp == 8 and "the engine's default" in "\n".join(eight.reasoning)
