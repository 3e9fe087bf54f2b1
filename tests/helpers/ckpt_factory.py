"""Small, structurally real checkpoints on disk in every source format the reader understands.

`make_checkpoint(root, fmt)` writes config files, shards (safetensors `save_file`) and the index, and
returns what it wrote: every tensor, plus per projection key the expected (packed uint8, scale,
ModelOpt-convention global or None) so tests can compare what the reader loads, byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin
from dsv4_convert.formats.mxfp4 import quantize_mxfp4
from dsv4_convert.formats.nvfp4 import quantize_nvfp4

__all__ = ["FORMATS", "Built", "make_checkpoint", "write_json", "write_shards"]

FORMATS = ("mxfp4-dsv4", "nvfp4-modelopt-dsv4", "nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-ct",
           "mxfp4-gptoss", "marlin")


@dataclass
class Built:
    root: Path
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    # projection key -> (packed uint8 [N, K/2], scale [N, K/g] (E4M3 or E8M0 bytes), global or None)
    expected: dict[str, tuple] = field(default_factory=dict)
    shards: dict[str, list[str]] = field(default_factory=dict)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2))


def write_shards(root: Path, tensors: dict[str, torch.Tensor], n_shards: int, *, single: bool = False,
                 metadata: dict | None = None) -> dict[str, list[str]]:
    """Split `tensors` (in order) into `n_shards` contiguous shards + index; or one model.safetensors."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if single:
        save_file(tensors, str(root / "model.safetensors"), metadata=metadata or {"format": "pt"})
        return {"model.safetensors": names}
    per = -(-len(names) // n_shards)
    shards, weight_map, total = {}, {}, 0
    for i in range(n_shards):
        chunk = names[i * per:(i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in chunk}, str(root / fname), metadata=metadata or {"format": "pt"})
        shards[fname] = chunk
        for k in chunk:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    write_json(root / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return shards


def _ds_config(layers: int, experts: int, hidden: int, inter: int, mtp: bool) -> dict:
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": hidden,
        "moe_intermediate_size": inter, "num_hidden_layers": layers, "n_routed_experts": experts,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hash_layers": 1,
        "num_nextn_predict_layers": 1 if mtp else 0, "vocab_size": 64, "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    }


def _fp8_block(g: torch.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.float8_e4m3fn)
    s = torch.full((-(-n // 128), -(-k // 128)), 120, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return w, s


def _ds_dense(g, layer: str, hidden: int, inter: int, experts: int, vocab: int, hash_layer: bool) -> dict:
    t = {}
    t[f"{layer}.attn_norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    t[f"{layer}.attn.wq_a.weight"], t[f"{layer}.attn.wq_a.scale"] = _fp8_block(g, hidden, hidden)
    t[f"{layer}.ffn.gate.weight"] = torch.randn(experts, hidden, generator=g).to(torch.bfloat16)
    t[f"{layer}.ffn.gate.bias"] = torch.zeros(experts, dtype=torch.float32)
    if hash_layer:
        t[f"{layer}.ffn.gate.tid2eid"] = torch.randint(0, experts, (vocab, 2), generator=g, dtype=torch.int64)
    for w, (n, k) in (("w1", (inter, hidden)), ("w2", (hidden, inter)), ("w3", (inter, hidden))):
        t[f"{layer}.ffn.shared_experts.{w}.weight"], t[f"{layer}.ffn.shared_experts.{w}.scale"] = _fp8_block(g, n, k)
    return t


def _shapes(hidden: int, inter: int, hf: bool) -> tuple:
    if hf:
        return (("gate_proj", inter, hidden), ("up_proj", inter, hidden), ("down_proj", hidden, inter))
    return (("w1", inter, hidden), ("w2", hidden, inter), ("w3", inter, hidden))


def make_checkpoint(root: Path, fmt: str, *, layers: int = 2, experts: int = 4, hidden: int = 128,
                    inter: int = 64, shards: int = 3, mtp: bool = False, seed: int = 0,
                    single: bool = False) -> Built:
    g = torch.Generator().manual_seed(seed)
    out = Built(root=Path(root))
    t = out.tensors
    hf = fmt in ("nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-ct", "mxfp4-gptoss")
    vocab = 64
    config = _ds_config(layers, experts, hidden, inter, mtp)
    hf_quant = None
    t["model.embed_tokens.weight" if hf else "embed.weight"] = torch.randn(vocab, hidden, generator=g).to(torch.bfloat16)

    def randw(n, k):
        return torch.randn(n, k, generator=g) * 0.02

    if fmt == "mxfp4-gptoss":
        config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
                  "intermediate_size": inter, "num_hidden_layers": layers, "num_local_experts": experts,
                  "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                      "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
        for L in range(layers):
            p = f"model.layers.{L}.mlp"
            t[f"{p}.router.weight"] = torch.randn(experts, hidden, generator=g).to(torch.bfloat16)
            gate_up_b, gate_up_s, down_b, down_s = [], [], [], []
            for e in range(experts):
                gw, gs = quantize_mxfp4(randw(inter, hidden))
                uw, us = quantize_mxfp4(randw(inter, hidden))
                dw, ds = quantize_mxfp4(randw(hidden, inter))
                out.expected[f"{p}.experts.{e}.gate_proj"] = (gw, gs, None)
                out.expected[f"{p}.experts.{e}.up_proj"] = (uw, us, None)
                out.expected[f"{p}.experts.{e}.down_proj"] = (dw, ds, None)
                gu_w = torch.stack([gw, uw], dim=1).reshape(2 * inter, hidden // 2)  # rows interleaved
                gu_s = torch.stack([gs, us], dim=1).reshape(2 * inter, hidden // 32)
                gate_up_b.append(gu_w.reshape(2 * inter, hidden // 32, 16))
                gate_up_s.append(gu_s)
                down_b.append(dw.reshape(hidden, inter // 32, 16))
                down_s.append(ds)
            t[f"{p}.experts.gate_up_proj_blocks"] = torch.stack(gate_up_b)
            t[f"{p}.experts.gate_up_proj_scales"] = torch.stack(gate_up_s)
            t[f"{p}.experts.gate_up_proj_bias"] = torch.zeros(experts, 2 * inter, dtype=torch.bfloat16)
            t[f"{p}.experts.down_proj_blocks"] = torch.stack(down_b)
            t[f"{p}.experts.down_proj_scales"] = torch.stack(down_s)
            t[f"{p}.experts.down_proj_bias"] = torch.zeros(experts, hidden, dtype=torch.bfloat16)
    else:
        layer_names = [f"layers.{L}" for L in range(layers)] + (["mtp.0"] if mtp else [])
        for li, layer in enumerate(layer_names):
            lp = f"model.layers.{li}" if hf else layer
            if not hf:
                t.update(_ds_dense(g, layer, hidden, inter, experts, vocab, hash_layer=li == 0))
            else:
                t[f"{lp}.mlp.gate.weight"] = torch.randn(experts, hidden, generator=g).to(torch.bfloat16)
            for e in range(experts):
                gate_global = None
                for proj, n, k in _shapes(hidden, inter, hf):
                    key = f"{lp}.mlp.experts.{e}.{proj}" if hf else f"{layer}.ffn.experts.{e}.{proj}"
                    w = randw(n, k)
                    is_mtp = layer.startswith("mtp.")
                    if fmt in ("mxfp4-dsv4", "mxfp4-ct") or (fmt == "nvfp4-modelopt-dsv4" and is_mtp) \
                            or (fmt == "marlin" and is_mtp):
                        packed, scale = quantize_mxfp4(w)
                        out.expected[key] = (packed, scale, None)
                        if fmt == "mxfp4-dsv4" or fmt == "nvfp4-modelopt-dsv4":
                            t[f"{key}.weight"] = packed.view(torch.int8)
                            t[f"{key}.scale"] = scale.view(torch.float8_e8m0fnu)
                        elif fmt == "mxfp4-ct":
                            t[f"{key}.weight_packed"] = packed
                            t[f"{key}.weight_scale"] = scale
                        else:
                            q, s = mxfp4_to_marlin(packed, scale, target=MarlinTarget())
                            t[f"{key}.weight"], t[f"{key}.weight_scale"] = q, s
                        continue
                    shared = gate_global if proj in ("w3", "up_proj") else None
                    packed, scale, glob = quantize_nvfp4(w, shared)
                    if proj in ("w1", "gate_proj"):
                        gate_global = glob
                    inp = torch.tensor(0.01 * (e + 1), dtype=torch.float32)
                    if fmt == "nvfp4-ct":
                        ct = (1.0 / glob).reshape(1)
                        out.expected[key] = (packed, scale, (1.0 / ct.float().max()).reshape(()))
                        t[f"{key}.weight_packed"] = packed
                        t[f"{key}.weight_scale"] = scale
                        t[f"{key}.weight_global_scale"] = ct
                        t[f"{key}.input_global_scale"] = (1.0 / inp).reshape(1)
                    elif fmt == "marlin":
                        out.expected[key] = (packed, scale, glob)
                        q, s = nvfp4_to_marlin(packed, scale, target=MarlinTarget())
                        t[f"{key}.weight"], t[f"{key}.weight_scale"] = q, s
                        t[f"{key}.weight_global_scale"] = nvfp4_global_to_marlin(
                            glob, fp32_global=False, act_dtype="bfloat16").to(torch.bfloat16)
                        t[f"{key}.weight_scale_2"] = glob
                        t[f"{key}.input_scale"] = inp
                    else:
                        out.expected[key] = (packed, scale, glob)
                        t[f"{key}.weight"] = packed
                        t[f"{key}.weight_scale"] = scale
                        t[f"{key}.weight_scale_2"] = glob
                        t[f"{key}.input_scale"] = inp
    t["lm_head.weight" if hf else "head.weight"] = torch.randn(vocab, hidden, generator=g).to(torch.bfloat16)
    t["model.norm.weight" if hf else "norm.weight"] = torch.ones(hidden, dtype=torch.float32)

    if fmt == "nvfp4-modelopt-dsv4":
        qlayers = {f"layers.{L}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16} for L in range(layers)}
        config["quantization_config"].update({
            "moe_quant_algo": "NVFP4", "quant_algo": "MIXED_PRECISION", "group_size": 16,
            "quantized_layers": qlayers, "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]})
        hf_quant = {"producer": {"name": "modelopt", "version": "dsv4-nvfp4-experts"},
                    "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                                     "group_size": 16, "quantized_layers": qlayers,
                                     "exclude_modules": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]}}
    elif fmt == "nvfp4-modelopt-hf":
        config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                  "hidden_size": hidden, "num_hidden_layers": layers,
                  "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                          "ignore": ["lm_head", "model.layers.*.mlp.gate"]}}
        hf_quant = {"producer": {"name": "modelopt", "version": "0.40.0"},
                    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                     "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}}
    elif fmt in ("nvfp4-ct", "mxfp4-ct"):
        name = "nvfp4-pack-quantized" if fmt == "nvfp4-ct" else "mxfp4-pack-quantized"
        gs = 16 if fmt == "nvfp4-ct" else 32
        config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                  "hidden_size": hidden, "num_hidden_layers": layers,
                  "quantization_config": {
                      "quant_method": "compressed-tensors", "format": name, "quantization_status": "compressed",
                      "config_groups": {"group_0": {"targets": ["Linear"], "format": name, "weights": {
                          "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": gs}}},
                      "ignore": ["lm_head", "re:.*mlp.gate$"]}}
    elif fmt == "marlin":
        config["quantization_config"] = {"quant_method": "marlin_fp4", "format_version": 1,
                                         "marlin_layout": "sglang-L2", "target_engine": "sglang",
                                         "act_dtype": "bfloat16", "w4a8": False,
                                         "source_format": "nvfp4-modelopt-dsv4", "weight_format": "nvfp4",
                                         "group_size": 16, "experts": {
                                             f"{layer}.ffn.experts": "mxfp4" if layer.startswith("mtp.") else
                                             "nvfp4" for layer in layer_names},
                                         "original_quantization_config": config["quantization_config"]}
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "config.json", config)
    if hf_quant is not None:
        write_json(root / "hf_quant_config.json", hf_quant)
    (root / "tokenizer.json").write_text("{}")
    (root / "README.md").write_text("test checkpoint\n")
    out.shards = write_shards(root, t, shards, single=single)
    return out
