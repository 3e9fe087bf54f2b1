"""config.json keys an engine reads while it builds a family's model, which a producer may not write: without
them the engine cannot build (or load) the SOURCE itself, so no conversion of it, which keeps its config.json,
can be served either. The converter's gate (through core/targets/served.py `refusal`), validate (`source.engine_config`)
and `doctor` say so instead of calling such a checkpoint clean.

Facts, from the engines' own model files (quoted where the proof, serving_tests/test_engine_refusals.py, shows
them fail on the real producers' DeepSeek-V3 exports: ModelOpt 0.47 and llm-compressor 0.14 save through
transformers 5, whose DeepseekV3Config has no `moe_layer_freq`, `topk_method` or `scoring_func`):
- SGLang 0.5.23 models/deepseek_v2.py reads `config.moe_layer_freq` (`_is_layer_sparse`), `config.topk_method`
  and `config.scoring_func` as plain attributes: AttributeError while the model is built.
- vLLM 0.33.0 / 0.34.0 models/deepseek_v2.py creates `gate.e_score_correction_bias` only when
  `getattr(config, "topk_method", None) == "noaux_tc"`: a checkpoint holding that tensor fails to load (KeyError).
A source the engine cannot LOAD whatever its config says, for a tensor it holds:
- SGLang 0.5.23 models/qwen4_exp.py builds each Qwen3.8-Flash-Next PLE n-gram table BF16 or FP8 only
  (_ple_table_is_fp8) and copies every `ngram_embedding.shard_<i>.weight` into it (load_qwen4_exp_ple_shard): NVFP4
  tables (packed E2M1 rows, a per-shard `weight_scale`: core/sources/side_tables.py) fail there (RuntimeError, the
  packed rows half as wide). vLLM 0.33 / 0.34 load them (common/ngram_embedding.py Qwen4ExpPLENvFp4EmbeddingMethod).
And config.json keys that make a model no release serves with FP4 experts: per-layer expert pruning
(`approximate_experts`, `compression_config.transform_config.expert_substitution`; _PRUNED quotes both engines).
Pure: no engine import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..sources.families import family_of
from .engines import RELEASES

__all__ = ["ENGINE_CONFIG_KEYS", "fix_hint", "missing_engine_keys", "source_load_refusal"]

# family -> the keys the engines read to build it, with the values DeepSeek-V3's own config.json carries
ENGINE_CONFIG_KEYS = {
    family: {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    for family in ("deepseek-v3", "deepseek-v32")
}
_BIAS = "e_score_correction_bias"


def missing_engine_keys(config: Mapping) -> dict:
    """The keys (with DeepSeek-V3's values) this family's engines read that config.json (or its text_config)
    lacks; {} when none is missing or the family has none."""
    family = family_of(config)
    wanted = ENGINE_CONFIG_KEYS.get(family.name, {}) if family else {}
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    return {k: v for k, v in wanted.items() if k not in config and k not in text}


# release key -> (the keys it reads, the stored tensor whose load fails without them (None: the build fails
# already), the engine's own failure)
_READS = {
    "sglang 0.5.23": (("moe_layer_freq", "topk_method", "scoring_func"), None,
                      "SGLang's models/deepseek_v2.py reads them as plain attributes (`config.moe_layer_freq` in "
                      "_is_layer_sparse, `config.topk_method`, `config.scoring_func`): it cannot build the source's "
                      "model (AttributeError)"),
    **{key: (("topk_method",), _BIAS,
             "vLLM's models/deepseek_v2.py creates `gate.e_score_correction_bias` only when "
             "`getattr(config, \"topk_method\", None) == \"noaux_tc\"`: it cannot load the checkpoint's "
             f"`mlp.gate.{_BIAS}` (KeyError)") for key in ("vllm 0.33", "vllm 0.34")},
}


# release key -> (the stored tensors it cannot load, the engine's own failure, what to do instead)
_TENSORS = {
    "sglang 0.5.23": (re.compile(r"\.ple\.ple_embedding\.ngram_embedding\.shard_\d+\.weight_scale$"),
                      "the checkpoint's Qwen4-Exp PLE n-gram tables are NVFP4, and SGLang's models/qwen4_exp.py builds "
                      "a PLE table BF16 or FP8 only (_ple_table_is_fp8) and copies each `shard_<i>.weight` into it "
                      "(load_qwen4_exp_ple_shard: RuntimeError, the packed rows are half as wide)",
                      "serve it with vLLM (its NVFP4 PLE method), or use a release with FP8 or BF16 n-gram tables"),
}


def _tensor_refusal(engine: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(the engine's failure, the fix) for a stored tensor `engine` cannot load, or None."""
    for key, (pattern, why, fix) in _TENSORS.items():
        if engine in (key, key.split(" ", 1)[0]) and any(pattern.search(n) for n in names):
            return why, fix
    return None


# release key -> architectures of a served family that release's model registry does not have, with its own failure:
# Kimi-K3.1 (`KimiK31ForConditionalGeneration`, model_type kimi_k31) is new in vLLM 0.34.0 (model_executor/models/
# registry.py maps it to vllm.models.kimi_k3, transformers_utils/config.py kimi_k31 -> KimiK3Config); vLLM 0.33.0 and
# SGLang 0.5.23 know KimiK3ForConditionalGeneration only (serving_tests/test_engine_refusals.py shows each fail)
_NO_ARCHITECTURE = {
    "vllm 0.33": {"KimiK31ForConditionalGeneration": (
        "vLLM 0.33.0's registry has no KimiK31ForConditionalGeneration and its config lookup no model_type kimi_k31 "
        "(ModelConfig: \"The checkpoint you are trying to load has model type `kimi_k31` but Transformers does not "
        "recognize this architecture\")")},
    "sglang 0.5.23": {"KimiK31ForConditionalGeneration": (
        "SGLang 0.5.23 has no model class KimiK31ForConditionalGeneration (its models/kimi_k3.py EntryClass is "
        "KimiK3ForConditionalGeneration, KimiK3LinearForCausalLM) and no config for model_type kimi_k31")},
}


def _no_architecture(config: Mapping, engine: str) -> str | None:
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    return next((why for arch in archs for why in (_NO_ARCHITECTURE.get(engine, {}).get(arch),) if why), None)


# Per-layer expert pruning (core/sources/structure.py substituted_experts), which no release serves for FP4 experts;
# serving_tests/test_engine_refusals.py shows both on a pruned replica
_PRUNED = {
    **{key: "vLLM builds SubstitutedRoutedExperts for a pruned layer, which refuses quantised experts "
            "(fused_moe/expert_substitution.py: \"expert substitution does not support: quantized MoE weights\")"
       for key in ("vllm 0.33", "vllm 0.34")},
    "sglang 0.5.23": "SGLang reads neither field (no code of it names them): it allocates every expert, leaves the "
                     "pruned ones without weights and drops their `approx_value` constants (its loaders skip a name "
                     "they have no parameter for), so tokens routed to them get an empty expert",
}


def _pruned_layers(config: Mapping) -> list[tuple[str, str]]:
    """(layer, the config field) of each layer whose experts a per-layer pruning replaced."""
    from ..sources.structure import model_dims, substituted_experts  # structure's rules import this module's family

    layers = model_dims(dict(config))["layers"] or 0
    return [(str(i), by) for i in range(layers) for ids, by in [substituted_experts(dict(config), str(i))] if ids]


def source_load_refusal(config: Mapping, engine: str, tensor_names: Iterable[str] = ()) -> str | None:
    """Why `engine` (a name or a release key) cannot build or load this source's model from its config.json or its
    tensors, or None. `tensor_names`: the checkpoint's tensors (vLLM fails only where the correction bias is stored). An
    architecture one release lacks is refused for that release key only (another release of the engine has it)."""
    names = tuple(tensor_names)
    if said := _tensor_refusal(engine, names):
        return said[0]
    releases = [key for key in RELEASES if key.split(" ", 1)[0] == engine] or [engine]  # a name: all its releases
    reasons = [_no_architecture(config, key) for key in releases]
    if all(reasons):
        return reasons[0]
    if pruned := _pruned_layers(config):
        why = next((w for key, w in _PRUNED.items() if engine in (key, key.split(" ", 1)[0])), None)
        if why:
            return (f"{pruned[0][1]} prunes experts per layer ({len(pruned)} layer(s), first {pruned[0][0]}), and "
                    f"{why}")
    missing = missing_engine_keys(config)
    if not missing:
        return None
    for key, (reads, tensor, why) in _READS.items():
        lacks = [k for k in reads if k in missing]
        if engine in (key, key.split(" ", 1)[0]) and lacks and (
                tensor is None or any(n.endswith(tensor) for n in names)):
            return f"config.json lacks {', '.join(lacks)}, and {why}"
    return None


def fix_hint(config: Mapping, engine: str = "", tensor_names: Iterable[str] = ()) -> str:
    """What to do: for a tensor `engine` cannot load, the way round it; else what to add to config.json, the keys and
    the values the release's own config.json carries (a model pruned per layer: what to serve instead)."""
    if said := _tensor_refusal(engine, tuple(tensor_names)):
        return said[1]
    if _pruned_layers(config):
        return ("no engine release serves FP4 experts pruned per layer: quantise the unpruned model, or serve a "
                "pruning that keeps the same expert count in every layer (llm-compressor's REAP writes it as "
                "`num_experts`)")
    keys = ", ".join(f'"{k}": {v!r}' for k, v in missing_engine_keys(config).items()).replace("'", '"')
    return (f"add {keys} to config.json (the values DeepSeek-V3's own config.json carries; check your model's "
            "release), then validate again")
