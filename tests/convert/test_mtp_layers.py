"""MTP (draft) layers of the families (synth/mtp.py has the releases' facts, core/sources/mtp.py tells the layers apart):
DeepSeek-R1 / V3 / V3.2 FP4 ship a BF16 layer `model.layers.<num_hidden_layers>` excluded from the NVFP4 method,
Kimi-K2 none, MiniMax-M2 declares three and ships none, Qwen3.5 / Qwen3-Next a BF16 `mtp.*` block. The converter
copies a draft layer without FP4 experts byte for byte and says so (CLI report, SERVING.md); inspect lists it;
marlin-to-source gives it back byte for byte (also in test_families.py for every family).

Substitutions: the checkpoints are `dsv4-convert synth --family` replicas (tiny sizes, synthetic values) built
from the public facts in synth/mtp.py, not the released weights. The CLI command lines run in one CLI process, in
order (run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), not one
process each: a process start costs more than these commands.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.sources.mtp import copied_mtp_layers, mtp_layers
from dsv4_convert.synth.mtp import MINIMAX_MTP_CONFIG
from tests.helpers.cli import restored_tree, run_cli_batch, succeeded, tree_hashes

_SIZES = {"layers": 2, "experts": 4, "hidden": 128, "intermediate": 128, "shards": 2}
_DEEPSEEK_MTP = ["deepseek-v3", "deepseek-v3-0324", "deepseek-v32"]


def _headers(root) -> dict[str, str]:
    """tensor name -> safetensors dtype, over the indexed shards."""
    out = {}
    for shard in sorted(root.glob("model-*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[name] = str(f.get_slice(name).get_dtype())
    return out


def _bytes(root, names) -> dict[str, bytes]:
    out = {}
    for shard in sorted(root.glob("model-*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in set(f.keys()) & set(names):
                out[name] = f.get_tensor(name).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


def test_draft_layers_by_name_and_config():
    config = {"num_hidden_layers": 61}
    names = ["model.layers.60.mlp.experts.0.gate_proj.weight", "model.layers.61.eh_proj.weight",
             "model.layers.61.mlp.experts.3.up_proj.weight", "mtp.fc.weight", "mtp.layers.0.mlp.gate.weight",
             "mtp.0.ffn.experts.1.w1.weight", "lm_head.weight"]
    assert mtp_layers(names, config) == ["model.layers.61", "mtp.0", "mtp.layers.0"]
    # without num_hidden_layers only the `mtp.` block is known; a nested text_config counts (multimodal wrappers)
    assert mtp_layers(names, {}) == ["mtp.0", "mtp.layers.0"]
    nested = {"text_config": {"num_hidden_layers": 40}, "num_hidden_layers": 99}
    assert mtp_layers(["model.language_model.layers.40.mlp.gate.weight"], nested) == ["model.language_model.layers.40"]
    assert copied_mtp_layers(names, config, ["mtp.0.ffn.experts.1.w1.weight"]) == {"model.layers.61": 2,
                                                                                      "mtp.layers.0": 1}


@pytest.mark.parametrize("fam", _DEEPSEEK_MTP)
def test_deepseek_replica_ships_a_bf16_mtp_layer_excluded_from_nvfp4(synth_source, fam):
    src = synth_source("nvfp4-modelopt-hf", family=fam, **_SIZES)
    config = json.loads((src / "config.json").read_text())
    n = config["num_hidden_layers"]
    assert config["num_nextn_predict_layers"] == 1
    exclude = json.loads((src / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert f"model.layers.{n}*" in exclude  # ModelOpt's examples/deepseek/ptq.py, renamed by quantize_to_nvfp4.py
    mtp = {k: v for k, v in _headers(src).items() if k.startswith(f"model.layers.{n}.")}
    for tail in ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                 "shared_head.head.weight", "self_attn.kv_a_proj_with_mqa.weight", "mlp.shared_experts.up_proj.weight",
                 "mlp.experts.3.down_proj.weight"):
        assert mtp.get(f"model.layers.{n}.{tail}") == "BF16", tail
    assert {d for k, d in mtp.items() if not k.endswith("e_score_correction_bias")} == {"BF16"}
    projections = open_checkpoint(src).projections
    assert projections and all(p.layer != str(n) for p in projections)


def test_kimi_and_minimax_replicas_write_no_mtp_tensors(synth_source):
    kimi = synth_source("nvfp4-modelopt-hf", family="kimi-k2", **_SIZES)
    assert json.loads((kimi / "config.json").read_text())["num_nextn_predict_layers"] == 0
    minimax = synth_source("nvfp4-modelopt-hf", family="minimax-m2", **_SIZES)
    config = json.loads((minimax / "config.json").read_text())
    assert {k: config[k] for k in MINIMAX_MTP_CONFIG} == {"use_mtp": True, "num_mtp_modules": 3,
                                                         "mtp_transformer_layers": 1}
    for root in (kimi, minimax):
        ckpt = open_checkpoint(root)
        assert mtp_layers(ckpt.tensors, ckpt.config) == []


TARGETS = ["vllm", "sglang"]


@pytest.fixture(scope="module")
def runs(synth_source, tmp_path_factory) -> dict:
    """(test, case, step) -> the CLI's answer, and "dir": every CLI test's command lines in one CLI process."""
    d = tmp_path_factory.mktemp("mtp")
    deepseek = synth_source("nvfp4-modelopt-hf", family="deepseek-v3", **_SIZES)
    steps = {}
    for t in TARGETS:
        out = d / f"deepseek-{t}" / "out"
        steps.update({("deepseek", t, "json"): ["nvfp4-to-marlin", deepseek, out, "--target", t, "--json"],
                      ("deepseek", t, "text"): ["nvfp4-to-marlin", deepseek, d / f"deepseek-{t}" / "out2", "--target", t],
                      ("deepseek", t, "inspect"): ["inspect", out, "--json"],
                      ("deepseek", t, "reverse"): ["marlin-to-source", out, d / f"deepseek-{t}" / "back", "-q"]})
    steps["qwen", None, "json"] = ["nvfp4-to-marlin", synth_source("nvfp4-modelopt-hf", family="qwen3-next", **_SIZES),
                                   d / "qwen" / "out", "--target", "vllm", "--json"]
    steps["plan", None, "json"] = ["plan", deepseek, "--json", "--gpus", 1]
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), d))), "dir": d}



@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_deepseek_mtp_layer_is_copied_said_and_reversed(synth_source, runs, target):
    src = synth_source("nvfp4-modelopt-hf", family="deepseek-v3", **_SIZES)
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    layer = f"model.layers.{n}"
    d = runs["dir"] / f"deepseek-{target}"
    out = d / "out"
    report = json.loads(succeeded(runs["deepseek", target, "json"]).stdout)
    assert report["mtp_copied"] == [layer]
    record = json.loads((out / "config.json").read_text())["quantization_config"]
    assert not any(c.startswith(f"{layer}.") for c in record["experts"])  # nothing of the draft converted
    names = [k for k in _headers(src) if k.startswith(f"{layer}.")]
    assert _bytes(out, names) == _bytes(src, names) and len(names) > 30
    notes = (out / "SERVING.md").read_text()
    assert f"`{layer}` ({len(names)} tensors): copied byte for byte" in notes
    text = succeeded(runs["deepseek", target, "text"]).stdout
    assert f"MTP (draft) layers copied byte for byte (no FP4 experts): {layer}" in text
    inspected = json.loads(succeeded(runs["deepseek", target, "inspect"]).stdout)
    assert inspected["mtp_layers"] == [layer] and str(n) not in inspected["layers"]
    succeeded(runs["deepseek", target, "reverse"])
    assert restored_tree(d / "back") == tree_hashes(src)


@pytest.mark.slow
def test_qwen_mtp_block_is_copied_and_said(runs):
    report = json.loads(succeeded(runs["qwen", None, "json"]).stdout)
    assert report["mtp_copied"] == ["mtp.layers.0"]
    assert "`mtp.layers.0` (" in (runs["dir"] / "qwen" / "out" / "SERVING.md").read_text()


@pytest.mark.slow
def test_plan_does_not_count_the_draft_layer_as_served_weights(synth_source, runs):
    """The engines' main models skip the draft layer; only speculative decoding loads it (docs/PLAN.md)."""
    src = synth_source("nvfp4-modelopt-hf", family="deepseek-v3", **_SIZES)
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    ckpt = open_checkpoint(src)
    mtp = sum(ref.nbytes for name, ref in ckpt.tensors.items() if name.startswith(f"model.layers.{n}."))
    plan = json.loads(runs["plan", None, "json"].stdout)
    m = plan["model"]
    assert m["draft_bytes"] == mtp > 0
    assert m["expert_bytes"] + m["other_bytes"] + mtp == sum(ref.nbytes for ref in ckpt.tensors.values())
    assert any("MTP (draft) layers" in r for r in plan["reasoning"])
