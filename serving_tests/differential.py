"""The cases of the differential proof (serving_tests/test_differential.py): one entry per (family, source
format), engine-free. Each case's source checkpoint is `dsv4-convert synth --family F --format FMT` (real
tensor names and configs at shrunk sizes, synth/families.py), optionally edited by a named `edit` (a
release's quantisation-config pattern the generator does not write itself), and its conversion is the
real CLI (`nvfp4-to-marlin` / `mxfp4-to-marlin --target ENGINE --act-dtype DTYPE`).

Adding a family: append a `Case` to CASES (and, if its source needs a pattern synth does not write, an
edit function to EDITS). The engine harnesses (serving_tests/{vllm,sglang}/harness_differential.py)
build both models with the engine's own construction from each checkpoint's config.json; a family whose
model needs an engine step a CPU cannot run gets that step substituted there, listed in the test file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from synth import run_converter

__all__ = ["CASES", "EDITS", "SYNTH_ARGS", "PRODUCERS", "Case", "make_case"]

# the real producers' outputs (NVIDIA ModelOpt, llm-compressor): tests/convert/test_producers.py says how they were made
PRODUCERS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "producers"


@dataclass(frozen=True)
class Case:
    family: str                 # synth --family (core/sources/families.py)
    fmt: str                    # synth --format: the source's on-disk format
    edit: str | None = None     # a name in EDITS: rewrites the synth source before conversion
    dtypes: tuple[str, ...] = ("bfloat16",)  # model dtypes to build under (each converted for that act dtype)
    engines: tuple[str, ...] = ("vllm", "sglang")
    text_only: bool = False     # a multimodal wrapper served text-only (vLLM --language-model-only): no tower built
    producer: str | None = None  # a real producer's output (tests/fixtures/producers/NAME) as the source, not synth

    @property
    def id(self) -> str:
        tags = (self.producer.replace(f"-{self.family}-", "-") if self.producer else None, self.edit)
        return "-".join((self.family, self.fmt, *(t for t in tags if t)))


def _per_layer_attention_excludes(src: Path) -> None:
    """nvidia/Qwen3-235B-A22B-Instruct-2507-NVFP4: BF16 attention listed per layer and projection
    (`model.layers.N.self_attn.q_proj`, ...; sgl-project/sglang#18189 quotes the list) instead of the
    30B release's `model.layers.*.self_attn*` wildcard. The engines fuse q/k/v into `qkv_proj`, so only
    the packed-modules mapping can match these entries. Same tensors; only the two configs change."""
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    per_layer = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(layers) for p in ("q", "k", "v", "o")]

    def rewrite(names: list[str]) -> list[str]:
        assert "model.layers.*.self_attn*" in names, names  # the synth pattern this edit replaces
        return [n for n in names if n != "model.layers.*.self_attn*"] + per_layer

    qc = config["quantization_config"]
    qc["ignore"] = rewrite(qc["ignore"])
    (src / "config.json").write_text(json.dumps(config, indent=2))
    hfq_path = src / "hf_quant_config.json"
    hfq = json.loads(hfq_path.read_text())
    hfq["quantization"]["exclude_modules"] = rewrite(hfq["quantization"]["exclude_modules"])
    hfq_path.write_text(json.dumps(hfq, indent=2))


def _kv_heads(src: Path) -> None:
    """synth's gpt-oss config.json omits num_key_value_heads, so transformers' default (8) exceeds its 2
    attention heads and no engine builds the model; the releases carry it (gpt-oss-20b: 8 of 64). Set
    to what synth's k_proj / v_proj hold: one head."""
    config = json.loads((src / "config.json").read_text())
    assert "num_key_value_heads" not in config, "synth now writes num_key_value_heads: drop this edit"
    config["num_key_value_heads"] = 1
    (src / "config.json").write_text(json.dumps(config, indent=2))


def _fused_globals(src: Path) -> None:
    """llm-compressor gives the projections an engine fuses (gate/up of a dense MLP or shared expert,
    q/k/v) one weight global scale; synth quantises each with its own, which SGLang's weight-only NVFP4
    linear refuses ("requires all fused projections to share one weight_global_scale"). Each fused
    group outside the routed experts takes its first member's global (the tensors stay valid NVFP4)."""
    from safetensors.torch import load_file, save_file

    groups = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"))
    for shard in sorted(src.glob("*.safetensors")):
        tensors = load_file(shard)
        changed = False
        for name in [n for n in tensors if n.endswith(".weight_global_scale") and ".experts." not in n]:
            for group in groups:
                for member in group[1:]:
                    if f".{member}." in name:
                        first = name.replace(f".{member}.", f".{group[0]}.")
                        if first in tensors:
                            tensors[name], changed = tensors[first].clone(), True
        if changed:
            save_file(tensors, shard, metadata={"format": "pt"})


def _mixed_precision(src: Path) -> None:
    """Qwen3-30B-A3B exported by ModelOpt with quant_algo MIXED_PRECISION (the per-layer form ModelOpt writes when
    a model holds more than one format: FP8 attention, NVFP4 experts; synth writes the same for Qwen3.5 /
    Qwen3.6, synth/family_configs.py): the BF16 attention becomes ModelOpt FP8 per tensor (`weight` E4M3,
    `weight_scale`, `input_scale`, as synth's FP8 linears), both configs list every quantised layer in
    `quantized_layers`, and the attention leaves the exclusions. The experts' tensors are unchanged."""
    import torch
    from safetensors.torch import load_file, save_file

    layers = {}
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    for shard in sorted(src.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in [n for n in tensors if ".self_attn." in n and n.endswith("_proj.weight")]:
            w = tensors[name].float()
            scale = (w.abs().max() / 448.0).float()
            base = name.removesuffix(".weight")
            tensors[name] = (w / scale).to(torch.float8_e4m3fn)
            tensors[f"{base}.weight_scale"], tensors[f"{base}.input_scale"] = scale.reshape(()), torch.tensor(0.01)
            layers[base] = {"quant_algo": "FP8"}
            if index is not None:
                index["weight_map"] |= {f"{base}.{t}": shard.name for t in ("weight_scale", "input_scale")}
        layers |= {n.removesuffix(".weight"): {"quant_algo": "NVFP4", "group_size": 16}
                   for n in tensors if ".experts." in n and n.endswith("_proj.weight")}
        save_file(tensors, shard, metadata={"format": "pt"})
    if index is not None:
        index_path.write_text(json.dumps(index, indent=2))
    config = json.loads((src / "config.json").read_text())
    hfq = json.loads((src / "hf_quant_config.json").read_text())
    keep = [m for m in config["quantization_config"]["ignore"] if "self_attn" not in m]
    assert keep != config["quantization_config"]["ignore"], "synth's attention exclusion is gone: revisit this edit"
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                     "quantized_layers": layers, "ignore": keep,
                                     "producer": config["quantization_config"]["producer"]}
    hfq["quantization"] = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": layers,
                           "exclude_modules": keep}
    (src / "config.json").write_text(json.dumps(config, indent=2))
    (src / "hf_quant_config.json").write_text(json.dumps(hfq, indent=2))


def _without_stale_block(src: Path) -> None:
    """The reference the engine loads for nvidia/DeepSeek-V3-0324-FP4: the source as shipped builds the block FP8 of
    its stale config.json block (serving_tests/test_families.py shows it), so the engine's correct load of it is the
    source with that block deleted (validate's fix for structure.quant_config.stale_block): both engines then read
    hf_quant_config.json, which is what the converter records for the plugin (`serves_from`). Tensors unchanged."""
    config = json.loads((src / "config.json").read_text())
    assert config.pop("quantization_config")["quant_method"] == "fp8", "the replica's stale block changed"
    (src / "config.json").write_text(json.dumps(config, indent=2))


# family -> how the engine's reference load differs from the converted source (a release shipped broken)
REFERENCES = {"deepseek-v3-0324": _without_stale_block}


def _nvidia_kimi_k25_names(src: Path) -> None:
    """nvidia/Kimi-K2.5-NVFP4's quantisation config names the text layers `language_model.layers.*` (SGLang 0.5.23
    kimi_k25.py: "Support nvidia/Kimi-K2.5-NVFP4 naming: language_model.layers.*. Ref: HF config.json for
    nvidia/Kimi-K2.5-NVFP4"; both engines map that prefix to `language_model.model.layers.`, vLLM 0.34 kimi_k25.py
    "For legacy NVFP4 checkpoint compatibility"), the tensors' own `language_model.model.layers.*`. The replica's
    exclude lists, in both configs, take that spelling; the tensors are unchanged."""
    def rewrite(names: list[str]) -> list[str]:
        assert any(n.startswith("language_model.model.layers.") for n in names), names  # what this edit replaces
        return [n.replace("language_model.model.layers.", "language_model.layers.", 1) for n in names]

    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["ignore"] = rewrite(config["quantization_config"]["ignore"])
    (src / "config.json").write_text(json.dumps(config, indent=2))
    hfq = json.loads((src / "hf_quant_config.json").read_text())
    hfq["quantization"]["exclude_modules"] = rewrite(hfq["quantization"]["exclude_modules"])
    (src / "hf_quant_config.json").write_text(json.dumps(hfq, indent=2))


def _kimi_k31(src: Path) -> None:
    """Kimi-K3.1's config.json names: `architectures [KimiK31ForConditionalGeneration]`, model_type `kimi_k31` (vLLM 0.34
    registry.py and transformers_utils/config.py map both to Kimi-K3's class and config). Only the names change: the
    replica has no DSA indexer, so it stands for K3.1 only where an engine refuses the architecture itself."""
    config = json.loads((src / "config.json").read_text())
    assert config["architectures"] == ["KimiK3ForConditionalGeneration"], config["architectures"]
    config["architectures"], config["model_type"] = ["KimiK31ForConditionalGeneration"], "kimi_k31"
    (src / "config.json").write_text(json.dumps(config, indent=2))


def _release_keys(src: Path) -> None:
    """The producers' DeepSeek-V3 exports, saved through transformers 5, lack config.json keys both engines read to
    build the model (core/targets/engine_config.py; serving_tests/test_engine_refusals.py shows both engines fail on
    the source as written): this is validate's fix (`source.engine_config`), the keys with the values DeepSeek-V3's own
    config.json carries. The tensors are the producer's, unchanged."""
    from dsv4_convert.core.targets.engine_config import missing_engine_keys

    config = json.loads((src / "config.json").read_text())
    keys = missing_engine_keys(config)
    assert keys, "the export carries the keys now: drop this edit"
    (src / "config.json").write_text(json.dumps({**config, **keys}, indent=2))


def _pruned(src: Path) -> None:
    """Per-layer expert pruning as vLLM 0.33 / 0.34 reads it (fused_moe/expert_substitution.py): layer 0's last expert
    is replaced by a constant (`approximate_experts` {"0": [E-1]}, its `approx_value` [hidden] in the model's dtype) and
    its weights leave the checkpoint; layer 1 keeps every expert, so the layers' expert counts differ."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    last = config["num_experts"] - 1
    prefix = f"model.layers.0.mlp.experts.{last}."
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = next(src / f for n, f in index["weight_map"].items() if n.startswith(prefix))
    tensors = {n: t for n, t in load_file(shard).items() if not n.startswith(prefix)}
    tensors[f"{prefix}approx_value"] = torch.full((config["hidden_size"],), 0.01, dtype=torch.bfloat16)
    save_file(tensors, shard, metadata={"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if not n.startswith(prefix)}
    index["weight_map"][f"{prefix}approx_value"] = shard.name
    index_path.write_text(json.dumps(index, indent=2))
    (src / "config.json").write_text(json.dumps({**config, "approximate_experts": {"0": [last]}}, indent=2))


EDITS = {"2507": _per_layer_attention_excludes, "release-keys": _release_keys, "pruned": _pruned, "k31": _kimi_k31, "kv-heads": _kv_heads, "fused-globals": _fused_globals,
         "nvidia-names": _nvidia_kimi_k25_names, "mixed-precision": _mixed_precision}
# edits that are synth's own size arguments (the source is written with them; no rewrite after)
SYNTH_ARGS = {
    # I = 192: not a multiple of 128, so SGLang pads non-gated experts (as Nemotron-3-Nano's 1856 -> 1920)
    "i192": ("--intermediate", "192"),
    # I = 96: w13 N = 96 breaks the Marlin tile rule unpadded; both engines pad it to 128 (SGLang's non-gated rule,
    # vLLM's one NVFP4 rule), so the conversion is written padded for TP 1 (CONVERT_ARGS)
    "i96": ("--intermediate", "96"),
    # H = 512: Kimi-K3's experts run at the latent width H / 2 = 256, which vLLM's MXFP4 MoE takes unpadded (it rounds
    # H up to a multiple of 256; the release's latent is 3584 = 14 x 256)
    "h512": ("--hidden", "512"),
}
# edits whose conversion is for one split (`--tp/--ep`: the padded per-rank layout)
CONVERT_ARGS = {"i96": ("--tp", "1")}

CASES = (
    # DeepSeek-V4: vLLM builds its CUDA model class (serving_tests/vllm/dsv4_cpu.py says why and what stands in)
    Case("deepseek-v4", "nvfp4-modelopt-dsv4"),
    Case("deepseek-v4", "mxfp4-dsv4"),
    # DeepSeek-V4.1 (Engram, vision tower, DSpark stages): vLLM builds DeepseekV41ForCausalLM (vllm/dsv41_cpu.py)
    Case("deepseek-v41", "mxfp4-dsv4"),
    Case("gpt-oss", "mxfp4-gptoss", edit="kv-heads"),
    Case("qwen3-moe", "nvfp4-modelopt-hf", dtypes=("bfloat16", "float16")),
    Case("qwen3-moe", "nvfp4-ct"),
    Case("qwen3-moe", "nvfp4-modelopt-hf", edit="2507"),
    # Qwen3-30B-A3B in ModelOpt MIXED_PRECISION: SGLang builds modelopt_mixed for its non-expert layers
    Case("qwen3-moe", "nvfp4-modelopt-hf", edit="mixed-precision", engines=("sglang",)),
    Case("glm4-moe", "nvfp4-modelopt-hf"),
    Case("glm4-moe", "nvfp4-ct", edit="fused-globals"),
    # fam-mla: DeepSeek-R1 / R1-0528 FP4 (MLA, hf_quant_config.json only), Kimi-K2, DeepSeek-V3.2 (MLA + indexer),
    # MiniMax-M2; Mixtral on vLLM only (SGLang refuses it: core/targets/served.py REFUSED)
    Case("deepseek-v3", "nvfp4-modelopt-hf"),
    Case("kimi-k2", "nvfp4-modelopt-hf"),
    # nvidia/DeepSeek-V3-0324-FP4 as shipped (stale block-FP8 config.json block): the conversion serves from
    # hf_quant_config.json; the engine's reference is the source without the stale block (REFERENCES)
    Case("deepseek-v3-0324", "nvfp4-modelopt-hf"),
    Case("deepseek-v32", "nvfp4-modelopt-hf"),
    Case("kimi-k25", "nvfp4-modelopt-hf", text_only=True),  # Kimi-K2.5 / K2.6: no MoonViT tensors in the replica
    Case("kimi-k25", "nvfp4-modelopt-hf", edit="nvidia-names", text_only=True),  # nvidia's excludes' spelling
    Case("glm5-moe", "nvfp4-modelopt-hf"),  # GLM-5.x: V3.2's DSA model (vLLM) / DeepseekV2ForCausalLM (SGLang)
    Case("minimax-m2", "nvfp4-modelopt-hf"),
    # GLM-5.3-Flash: KDA + MLA (kpool indexer) + mHC; the text class on vLLM only (SGLang 0.5.23 registers the
    # multimodal one alone: core/targets/served.py REFUSED), the multimodal one served text-only (no vision tensors)
    Case("glm5-next", "nvfp4-modelopt-hf", engines=("vllm",)),
    Case("glm5-next", "nvfp4-ct", engines=("vllm",)),
    Case("glm5-next-vl", "nvfp4-modelopt-hf", text_only=True),
    Case("glm5-next-vl", "nvfp4-ct", text_only=True),
    Case("mixtral", "nvfp4-modelopt-hf", engines=("vllm",)),
    # MiniMax-M3 / M3.1 (nvidia/MiniMax-M3-NVFP4's MIXED_PRECISION; M3.1's quant_method mxfp8 + compressed-tensors
    # NVFP4 experts); the VL wrapper text-only (no vision tensors in the replica)
    Case("minimax-m3", "nvfp4-modelopt-hf"),
    Case("minimax-m3", "nvfp4-ct-mxfp8"),
    Case("minimax-m3-vl", "nvfp4-ct-mxfp8", text_only=True),
    Case("minimax-m3-vl", "nvfp4-modelopt-hf", text_only=True),
    # fam-hybrid: the multimodal wrappers' replicas carry no vision tensors, so their towers are not built
    Case("qwen3.5-moe", "nvfp4-modelopt-hf", text_only=True),
    Case("qwen3.5-moe", "nvfp4-ct", text_only=True),
    Case("qwen3-next", "nvfp4-modelopt-hf"),
    Case("qwen3-next", "nvfp4-ct"),
    # SGLang 0.5.23 cannot load this source itself (core/targets/served.py _HYBRID says why): vLLM only
    Case("llama4", "nvfp4-modelopt-hf", text_only=True, engines=("vllm",)),
    Case("gemma4-moe", "nvfp4-modelopt-hf", text_only=True),
    # nemotron: Nemotron-H (Mamba-2 + attention + non-gated relu2 experts: w13 is up_proj alone)
    Case("nemotron-h", "nvfp4-modelopt-hf"),
    Case("nemotron-h", "nvfp4-modelopt-hf", edit="i192"),
    Case("nemotron-h", "nvfp4-modelopt-hf", edit="i96"),  # issue 37 item 7: the non-gated tile rule, padded
    Case("nemotron-3-super", "nvfp4-modelopt-hf"),  # LatentMoE: routed experts at moe_latent_size
    Case("gemma4-moe", "nvfp4-ct", text_only=True),  # mtp: RedHatAI/gemma-4-26B-A4B-it-NVFP4 (synth/families.py)
    # Kimi-K3: KDA + NoPE MLA, latent MoE (routed_expert_hidden_size), SiTU; no vision tensors in the replica
    Case("kimi-k3", "mxfp4-ct", edit="h512", text_only=True, engines=("vllm",)),
    Case("kimi-k3", "nvfp4-ct", edit="h512", text_only=True, engines=("vllm",)),
    # Qwen3.8-Flash-Next (synth/qwen4_exp.py): nvidia's MIXED_PRECISION with FP8 n-gram tables, its text architecture
    # (vLLM only: SGLang 0.5.23 registers Qwen4ExpForConditionalGeneration alone), the plain ModelOpt NVFP4 form, and
    # NVFP4 n-gram tables (vLLM only: SGLang cannot load them, core/targets/engine_config.py)
    Case("qwen4-exp", "nvfp4-modelopt-hf", text_only=True),
    Case("qwen4-exp-text", "nvfp4-modelopt-hf", engines=("vllm",)),
    Case("qwen4-exp-nvfp4", "nvfp4-modelopt-hf", text_only=True),
    Case("qwen4-exp-ple-nvfp4", "nvfp4-modelopt-hf", text_only=True, engines=("vllm",)),
    # producers: what ModelOpt 0.47 and llm-compressor 0.14 write (tests/fixtures/producers), loaded as written;
    # the outputs no engine loads are refused in serving_tests/test_engine_refusals.py (core/targets/served.py REFUSED)
    Case("qwen3-moe", "nvfp4-modelopt-hf", producer="modelopt-qwen3-moe-w4a16-nvfp4"),  # W4A16_NVFP4
    Case("qwen3-moe", "nvfp4-modelopt-hf", producer="modelopt-qwen3-moe-nvfp4-mlp-only"),
    Case("qwen3-moe", "nvfp4-ct", producer="llmc-qwen3-moe-nvfp4a16"),
    # SGLang builds any Mixtral conversion as QuantMixtralForCausalLM (core/targets/served.py REFUSED): vLLM only
    Case("mixtral", "nvfp4-ct", producer="llmc-mixtral-nvfp4a16", engines=("vllm",)),
    # llm-compressor's DeepSeek-V3 NVFP4A16 with the config keys its export lacks (validate's fix, `release-keys`); SGLang
    # cannot load it even then (serving_tests/test_engine_refusals.py)
    Case("deepseek-v3", "nvfp4-ct", edit="release-keys", producer="llmc-deepseek-v3-nvfp4a16", engines=("vllm",)),
    # llm-compressor's MXFP4A16: vLLM's CT MXFP4 MoE method (unpadded); SGLang cannot load it (test_engine_refusals.py)
    Case("qwen3-moe", "mxfp4-ct", producer="llmc-qwen3-moe-mxfp4a16", engines=("vllm",)),
    Case("mixtral", "mxfp4-ct", producer="llmc-mixtral-mxfp4a16", engines=("vllm",)),
)


def make_source(tmp, case: Case) -> Path:
    """The case's source replica (synth, then its edit), written once per session in `tmp`."""
    src = Path(tmp, f"src-{case.id}")
    if src.exists():
        return src
    if case.producer:
        shutil.copytree(PRODUCERS / case.producer, src)
    else:
        run_converter("synth", src, "--family", case.family, "--format", case.fmt, *SYNTH_ARGS.get(case.edit, ()), "-q")
    if case.edit in EDITS:
        EDITS[case.edit](src)
    return src


def make_case(tmp, case: Case, engine: str, dtype: str, *, allow_unservable: bool = False) -> tuple[Path, Path]:
    """(the source the engine loads, its conversion for `engine` at `dtype`), each written once per session in
    `tmp` (the session's `case_dir`, serving_tests/conftest.py: the differential and draft tests share them). The
    engine loads the source itself, or its REFERENCES form where the release as shipped does not load correctly.
    `allow_unservable`: a refusal's test converts what the gate refuses, to show the engine's own reason."""
    src = make_source(tmp, case)
    out = Path(tmp, f"conv-{case.id}-{engine}-{dtype}")
    if not out.exists():
        command = "mxfp4-to-marlin" if case.fmt.startswith("mxfp4") else "nvfp4-to-marlin"
        run_converter(command, src, out, "--target", engine, "--act-dtype", dtype, "--workers", 1, "-q",
             *CONVERT_ARGS.get(case.edit, ()), *(("--allow-unservable",) if allow_unservable else ()))
    if case.family in REFERENCES:
        ref = Path(tmp, f"ref-{case.id}")
        if not ref.exists():
            shutil.copytree(src, ref)
            REFERENCES[case.family](ref)
        return ref, out
    return src, out
