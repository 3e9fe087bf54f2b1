"""Converted checkpoints of the model families, for the whole-model engine tests (engine-free: the real CLI's
command lines, in the session's converter process, serving_tests/synth.py run_converter): `dsv4-convert synth
--family F --format FMT` (synth/families.py: the family's real names, config.json and quantisation config at
shrunk sizes), then `nvfp4-to-marlin` for the engine."""

from __future__ import annotations

import json
from pathlib import Path

from synth import run_converter

__all__ = ["CASES", "ENGINE_REFUSES", "ONE_ENGINE_CASES", "make_family"]

# (family, source format): the releases each stands for are in core/sources/families.py FAMILIES
CASES = (
    ("qwen3-moe", "nvfp4-modelopt-hf"),
    ("qwen3-moe", "nvfp4-ct"),
    ("glm4-moe", "nvfp4-modelopt-hf"),
    ("glm4-moe", "nvfp4-ct"),
    # DeepSeek-R1-0528 / R1 FP4 (MLA, hf_quant_config.json only), Kimi-K2 (model_type kimi_k2, routed experts
    # only NVFP4), DeepSeek-V3.2 (MLA + indexer), MiniMax-M2: synth/families.py and synth/mla.py name the sources
    ("deepseek-v3", "nvfp4-modelopt-hf"),
    ("kimi-k2", "nvfp4-modelopt-hf"),
    ("deepseek-v32", "nvfp4-modelopt-hf"),
    ("minimax-m2", "nvfp4-modelopt-hf"),
)
# proved on one engine only; the other refuses it with its own reason (ENGINE_REFUSES)
ONE_ENGINE_CASES = {"vllm": (("mixtral", "nvfp4-modelopt-hf"),), "sglang": ()}
ENGINE_REFUSES = {
    ("sglang", "mixtral"): (
        "SGLang 0.5.23 builds a quantised Mixtral as QuantMixtralForCausalLM whenever its quantization is not one "
        "of fp8, compressed-tensors, gptq_marlin, awq_marlin, quark_int4fp8_moe (sglang/srt/model_loader/utils.py "
        "get_model_architecture: \"Special handling for quantized Mixtral. FIXME(woosuk): This is a temporary "
        "hack.\"); that model makes every expert its own ReplicatedLinear, so there is no fused MoE layer for the "
        "plugin's Marlin method (the ModelOpt NVFP4 source itself is built that way too)"),
}


def make_family(tmp, family: str, fmt: str, engine: str, *, no_block: bool = False) -> tuple[Path, Path]:
    """(source, converted for `engine`). `no_block`: config.json without its quantization_config (the first
    nvidia/DeepSeek-R1-FP4 export), so only hf_quant_config.json says how the model is quantised."""
    tag = f"{family}-{fmt}{'-noblock' if no_block else ''}"
    src, out = Path(tmp, f"src-{tag}"), Path(tmp, f"conv-{tag}-{engine}")
    if not src.exists():
        run_converter("synth", src, "--family", family, "--format", fmt, "-q")
        if no_block:
            config = json.loads((src / "config.json").read_text())
            config.pop("quantization_config", None)
            (src / "config.json").write_text(json.dumps(config, indent=2))
    if not out.exists():
        # the proof decides what is served (the converter's gate reads its results), so it converts
        # whatever family it is proving
        run_converter("nvfp4-to-marlin", src, out, "--target", engine, "--workers", 1, "-q", "--allow-unservable")
    return src, out
