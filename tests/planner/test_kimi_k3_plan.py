"""`dsv4-convert plan` on Kimi-K3 (the real CLI on real safetensors headers): the expert tiles come from the latent
width the routed experts run at (`routed_expert_hidden_size`), and a real-size Kimi-K3 is said not to fit 8 x 96 GB,
with no launch command and plan's exit code for "no configuration fits".

Real size, from the engines' code (a headers-only checkpoint: real names, dtypes and shapes, the data a sparse hole):
896 experts per layer, latent 3584, hidden 7168 (vLLM 0.34 specialized_decode/cutedsl/moe/ep/comm.py `LATENT, TOPK,
EXPERTS = 3584, 16, 896`; SGLang 0.5.23 k3_ar_fusion "3584 / 7168"), moe_intermediate_size 2048 (vLLM 0.34
specialized_decode/cutedsl/moe/small_batch/experts.py ClusterExpertsTP8: 512 w13 rows and 8 w2 scale groups of 32 per
expert per rank at TP 8), 69 KDA layers (vLLM 0.34 specialized_decode/cutedsl/kda/commit.py "its 69 KDA layers").
Assumptions of this test: 23 MLA layers (Kimi-Linear's 3 KDA : 1 MLA), the first layer dense (91 MoE layers), and only
the embedding and head besides the experts: the experts alone, 888 GiB in MXFP4, exceed 8 x 96 GiB; the model's other
weights (the issue's 2.8T parameters in all) only add to that.

Substitutions: none (the replica is `dsv4-convert synth --family kimi-k3`; the real-size checkpoint holds headers only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli
from tests.helpers.padded_ref import write_header_only

pytestmark = pytest.mark.slow

HIDDEN, LATENT, INTER, EXPERTS, MOE_LAYERS, SHARDS = 7168, 3584, 2048, 896, 91, 8


def _plan(path: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli("plan", path, "--gpus", "8", "--gpu-mem-gib", "96", "--json", *args, check=False)
    return proc.returncode, json.loads(proc.stdout)


def test_replica_tiles_come_from_the_latent_width(tmp_path):
    src = write_synthetic_checkpoint(tmp_path / "k3", format="mxfp4-ct", family="kimi-k3", layers=2, experts=4,
                                     hidden=512, intermediate=128, shards=1)
    code, doc = _plan(src, "--target", "vllm")
    shape = doc["model"]
    assert (shape["hidden"], shape["intermediate"]) == (256, 128), shape  # routed_expert_hidden_size, not 512
    assert code == 0 and doc["recommended"] is not None, doc


@pytest.fixture(scope="module")
def real_size(tmp_path_factory) -> Path:
    """A real-size Kimi-K3 in compressed-tensors MXFP4, headers only (the module docstring gives the sources)."""
    root = tmp_path_factory.mktemp("kimi-k3-real")
    replica = write_synthetic_checkpoint(tmp_path_factory.mktemp("k3") / "src", format="mxfp4-ct", family="kimi-k3",
                                         layers=2, experts=4, hidden=512, intermediate=128, shards=1)
    config = json.loads((replica / "config.json").read_text())
    config["text_config"].update(hidden_size=HIDDEN, routed_expert_hidden_size=LATENT, moe_intermediate_size=INTER,
                                 num_experts=EXPERTS, num_experts_per_token=16, num_hidden_layers=MOE_LAYERS + 1,
                                 num_attention_heads=96, num_key_value_heads=96)
    (root / "config.json").write_text(json.dumps(config))
    shards: list[dict] = [{} for _ in range(SHARDS)]
    for layer in range(1, MOE_LAYERS + 1):
        for e in range(EXPERTS):
            for w, (n, k) in (("w1", (INTER, LATENT)), ("w3", (INTER, LATENT)), ("w2", (LATENT, INTER))):
                base = f"language_model.layers.{layer}.block_sparse_moe.experts.{e}.{w}"
                shards[layer % SHARDS][f"{base}.weight_packed"] = ("U8", (n, k // 2))
                shards[layer % SHARDS][f"{base}.weight_scale"] = ("U8", (n, k // 32))
    for name in ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"):
        shards[0][name] = ("BF16", (163840, HIDDEN))
    weight_map = {}
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        write_header_only(root / file, tensors)
        weight_map.update(dict.fromkeys(tensors, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def test_real_size_kimi_k3_does_not_fit_8x96(real_size):
    """On vLLM (which serves Kimi-K3): every split is refused for memory, none is recommended, no launch command, exit 1
    (cli/plan_cmd.py: "1 none does"). The tiles allow every split, so it is the size, not the shape, that refuses."""
    code, doc = _plan(real_size, "--target", "vllm")
    shape = doc["model"]
    assert (shape["hidden"], shape["intermediate"], shape["experts"], shape["layers"]) == (LATENT, INTER, EXPERTS,
                                                                                          MOE_LAYERS), shape
    assert shape["expert_bytes"] > 8 * 96 * 2**30, shape
    assert code == 1 and doc["recommended"] is None and doc["command"] is None, doc["reasoning"]
    verdicts = doc["candidates"]
    assert verdicts and all(c["tiles_ok"] for c in verdicts), verdicts  # the tiles allow every split: memory refuses
    assert all("do not fit 96 GiB" in " ".join(c["reasons"]) for c in verdicts), verdicts
