"""Converted checkpoints of the model families the plugins serve, for the whole-model engine tests
(engine-free: runs the real CLI in subprocesses).

Each family is `dsv4-convert synth` of its source format, with config.json made that architecture's
(the engines build their model class from it) and the few tensors the synthetic layout lacks for it
added in one more shard (listed in the index), then `*-to-marlin` for the engine.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from safetensors.torch import save_file

from synth import converter_cli

__all__ = ["FAMILIES", "make_family"]

HIDDEN, INTER, EXPERTS = 256, 256, 4


def _glm4_moe(config: dict) -> tuple[dict, dict]:
    """GLM-4.5 / GLM-4.5-Air MoE (ModelOpt NVFP4 by NVIDIA, compressed-tensors NVFP4 made with
    llm-compressor): q/k/v/o attention, router `mlp.gate` with its `e_score_correction_bias`, shared
    experts `mlp.shared_experts.{gate,up,down}_proj`, routed experts `mlp.experts.E.*` (the synthetic
    hf layout's names)."""
    config = dict(config)
    config.update(architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", num_key_value_heads=1,
                  intermediate_size=INTER, first_k_dense_replace=0, norm_topk_prob=True, routed_scaling_factor=1.0,
                  n_group=1, topk_group=1, partial_rotary_factor=0.5, use_qk_norm=False, attention_bias=False,
                  rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096, hidden_act="silu",
                  num_nextn_predict_layers=0)
    extra = {f"model.layers.{layer}.mlp.gate.e_score_correction_bias": torch.zeros(EXPERTS, dtype=torch.float32)
             for layer in range(config["num_hidden_layers"])}
    return config, extra


# family -> (synth source format, how config.json and the extra tensors are made)
FAMILIES = {
    "glm4-moe-modelopt": ("nvfp4-modelopt-hf", _glm4_moe),
    "glm4-moe-ct": ("nvfp4-ct", _glm4_moe),
}


def _run(*args) -> None:
    subprocess.run([*converter_cli(), *map(str, args)], check=True, capture_output=True)


def make_family(tmp, family: str, engine: str, *, no_block: bool = False) -> tuple[Path, Path]:
    """(source, converted for `engine`). `no_block`: config.json without its quantization_config (the first
    nvidia/DeepSeek-R1-FP4 export), so only hf_quant_config.json says how the model is quantised."""
    fmt, shape = FAMILIES[family]
    tag = f"{family}{'-noblock' if no_block else ''}"
    src, out = Path(tmp, f"src-{tag}"), Path(tmp, f"conv-{tag}-{engine}")
    if not src.exists():
        _run("synth", src, "--format", fmt, "--layers", 1, "--experts", EXPERTS, "--hidden", HIDDEN, "--intermediate", INTER,
             "--shards", 2, "-q")
        config, extra = shape(json.loads((src / "config.json").read_text()))
        if no_block:
            config.pop("quantization_config", None)
        (src / "config.json").write_text(json.dumps(config, indent=2))
        if extra:
            save_file(extra, str(src / "model-extra.safetensors"), metadata={"format": "pt"})
            index = json.loads((src / "model.safetensors.index.json").read_text())
            index["weight_map"].update({name: "model-extra.safetensors" for name in extra})
            (src / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (src / "synth.json").unlink()  # no longer what synth wrote
    if not out.exists():
        _run("nvfp4-to-marlin", src, out, "--target", engine, "--workers", 1, "-q")
    return src, out
