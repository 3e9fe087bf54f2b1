"""The one table of engine facts: what each serving engine expects of a converted checkpoint and how
it is launched. The converter, validate, `plan`, the SERVING.md writer and both plugins read it.
Pure (no engine import). The tile rule and the engines' padding numbers live in formats/tiles.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsv4_convert.formats import tiles

__all__ = [
    "ACT_DTYPES", "ENGINES", "FORMAT_VERSION", "LAYOUTS", "MXFP4_NEEDS_BF16", "QUANT_METHOD",
    "READABLE_FORMAT_VERSIONS", "EngineFacts", "engine_facts", "launch_command", "mxfp4_dtype_problem",
    "registration_log_line", "version_tuple",
]

QUANT_METHOD = "marlin_fp4"  # config.json quantization_config.quant_method of a converted checkpoint
# 2: quantization_config records the (TP, EP) layouts the experts serve unpadded ("layouts") and, for a
# `--tp/--ep` conversion, the one padded layout it was written for ("tp_layout"). 1: neither.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
ACT_DTYPES = ("bfloat16", "float16")
MXFP4_NEEDS_BF16 = ("MXFP4 Marlin runs with bfloat16 activations only (vLLM compiles no fp16 MXFP4 kernel; "
                    "SGLang would push the E8M0 scales through fp16 and destroy them)")


@dataclass(frozen=True, slots=True)
class EngineFacts:
    name: str
    layout_tag: str  # dsv4-convert's name for the bytes this engine's Marlin preparation produces
    oldest: tuple[int, ...]  # oldest engine version that produces those bytes
    version: str  # the version the layout was verified against byte for byte
    w4a8: bool  # has a W4A8 (fp8 activations) Marlin variant
    moe_backend_flag: str  # forces the Marlin MoE runner
    memory_flag: str
    serve: str  # launch prefix; {path} is the checkpoint
    tp_flag: str
    ep_flag: str  # {ep} is the expert-parallel size
    global_dtype: str  # dtype of the processed NVFP4 global: "F32" or the activation dtype

    def padding(self, fmt: str, hidden: int):
        return tiles.engine_padding(fmt, self.name, hidden)


ENGINES = {
    # vllm-L4: vLLM >= 0.20 (docs/spec/MARLIN_FP4.md §9), verified on 0.33.0
    "vllm": EngineFacts("vllm", "vllm-L4", (0, 20, 0), "0.33.0", True, "--moe-backend marlin",
                        "--gpu-memory-utilization", "vllm serve {path}", "--tensor-parallel-size",
                        "--enable-expert-parallel", "F32"),
    # sglang-L2: the NVFP4 Marlin fallback and the DSv4 MXFP4 Marlin method exist only since 0.5.2x;
    # 0.5.23 is the version verified byte for byte
    "sglang": EngineFacts("sglang", "sglang-L2", (0, 5, 23), "0.5.23", False, "--moe-runner-backend marlin",
                          "--mem-fraction-static", "python -m sglang.launch_server --model-path {path}", "--tp",
                          "--ep {ep}", "act"),
}
LAYOUTS = {e.layout_tag: e for e in ENGINES.values()}


def engine_facts(engine: str) -> EngineFacts:
    """The one check of an engine name."""
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(f"unknown target engine {engine!r}; choose one of {sorted(ENGINES)}") from None


def mxfp4_dtype_problem(act_dtype: str) -> str | None:
    """Why MXFP4 experts cannot be served with these activations, or None."""
    return None if act_dtype == "bfloat16" else MXFP4_NEEDS_BF16


def version_tuple(version: str) -> tuple[int, ...]:
    nums = []
    for part in version.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        nums.append(int(m.group()))
    return tuple(nums)


def launch_command(engine: str, path: str, *, tp: int, ep: int = 1, act_dtype: str | None = None,
                   memory: float | None = None) -> str:
    """The server command line for a checkpoint; `plan` and SERVING.md both print this one."""
    e = engine_facts(engine)
    parts = [e.serve.format(path=path), f"{e.tp_flag} {tp}"]
    if ep > 1:
        parts.append(e.ep_flag.format(ep=ep))
    parts.append(e.moe_backend_flag)
    if memory is not None:
        parts.append(f"{e.memory_flag} {memory:.2f}")
    if act_dtype is not None:
        parts.append(f"--dtype {act_dtype}")
    parts.append("--trust-remote-code")
    return " ".join(parts)


def registration_log_line(engine: str, engine_version: str) -> str:
    """The exact line each plugin logs (at INFO) when it registers; docs/SERVING.md quotes it."""
    return f"dsv4-convert: registered quantization method '{QUANT_METHOD}' for {engine} {engine_version}"
