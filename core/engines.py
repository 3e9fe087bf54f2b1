"""The one table of engine facts: what each serving engine expects of a converted checkpoint and how
it is launched. The converter, validate, `plan`, the SERVING.md writer, the CLI and both plugins read
it: a behaviour that differs between targets is a field here, never an `engine == ...` test elsewhere.
Pure (no engine import). The tile rule and the engines' padding numbers live in formats/tiles.py
(formats/ imports nothing of the project, so the codecs receive these facts as values).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = [
    "shell_quote",
    "ACT_DTYPES", "DEFAULT_ENGINE", "ENGINES", "FORMAT_VERSION", "LAYOUTS", "MXFP4_NEEDS_BF16", "QUANT_METHOD",
    "READABLE_FORMAT_VERSIONS", "EngineFacts", "engine_facts", "launch_command", "mxfp4_dtype_problem",
    "parallel_flags", "registration_log_line", "version_tuple",
]

QUANT_METHOD = "marlin_fp4"  # config.json quantization_config.quant_method of a converted checkpoint
# 2: quantization_config records the (TP, EP) layouts the experts serve unpadded ("layouts") and, for a
# `--tp/--ep` conversion, the one padded layout it was written for ("tp_layout"). 1: neither.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
ACT_DTYPES = ("bfloat16", "float16")  # the activation dtypes a target may name (--act-dtype)
DEFAULT_ENGINE = "sglang"
MXFP4_NEEDS_BF16 = ("MXFP4 Marlin runs with bfloat16 activations only (vLLM compiles no fp16 MXFP4 kernel; "
                    "SGLang would push the E8M0 scales through fp16 and destroy them)")


@dataclass(frozen=True, slots=True)
class EngineFacts:
    name: str
    display: str  # the engine's own spelling, for messages
    layout_tag: str  # dsv4-convert's name for the bytes this engine's Marlin preparation produces
    oldest: tuple[int, ...]  # oldest engine version that produces those bytes
    version: str  # the version the layout was verified against byte for byte
    w4a8: bool  # has a W4A8 (fp8 activations) Marlin variant
    global_dtype: str  # dtype of the processed NVFP4 global: "F32", or "act" (the activation dtype)
    # NVFP4 block scales (docs/spec/MARLIN_FP4.md §3.3): True = processed values below 2 and every negative
    # scale become 0 (vLLM >= 0.20); False = the sign is dropped, |s| is served
    scale_clamp: bool
    rescale: bool  # with bf16 activations, a power-of-two factor per stacked tensor lifts the scales
    moe_backend_flag: str  # forces the Marlin MoE runner
    memory_flag: str
    # True: the memory share covers activations and CUDA graphs too (the engine profiles them inside it);
    # False: a static pool for weights + KV cache, activations and graphs live outside it
    memory_profiled: bool
    serve: str  # launch prefix; {path} is the checkpoint
    tp_flag: str  # {tp} is the tensor-parallel size
    ep_flag: str  # {ep} is the expert-parallel size
    sm120_moe_default: str  # which MoE path the engine picks on sm_120 by itself (why the flag is needed)
    # the engine's own methods (core/inner_methods.py names) the plugin hands the non-expert layers to,
    # each loaded in serving_tests with the engine's code, as (method, model_type or None for any);
    # any other is refused by validate's pre-flight and doctor
    inner_methods: frozenset = frozenset()

    def serves_inner(self, method: str, model_type: str | None) -> bool:
        return (method, None) in self.inner_methods or (method, model_type) in self.inner_methods

    @property
    def fp32_global(self) -> bool:
        return self.global_dtype == "F32"

    def describe(self) -> str:
        """`vllm-L4` (vLLM >= 0.20, verified on 0.33.0): the one line --help and docs print per target."""
        oldest = ".".join(map(str, self.oldest))
        since = f">= {oldest}, verified on {self.version}" if oldest != self.version else self.version
        return f"`{self.layout_tag}` ({self.display} {since})"


ENGINES = {
    # vllm-L4: vLLM >= 0.20 (docs/spec/MARLIN_FP4.md §9), verified on 0.33.0
    "vllm": EngineFacts(
        "vllm", "vLLM", "vllm-L4", (0, 20, 0), "0.33.0", w4a8=True, global_dtype="F32", scale_clamp=True,
        rescale=True, moe_backend_flag="--moe-backend marlin", memory_flag="--gpu-memory-utilization",
        memory_profiled=True, serve="vllm serve {path}", tp_flag="--tensor-parallel-size {tp}",
        ep_flag="--enable-expert-parallel",  # EP then spans the TP ranks
        sm120_moe_default="vLLM usually auto-selects Marlin on sm_120, but an SM100 path can still be picked "
                          "for NVFP4",
        inner_methods=frozenset({("deepseek_v4_fp8", "deepseek_v4"), ("gpt_oss_mxfp4", "gpt_oss"),
                                 ("modelopt_fp4", None), ("modelopt_mixed", "deepseek_v4"),
                                 ("compressed-tensors", None)})),
    # sglang-L2: the NVFP4 Marlin fallback and the DSv4 MXFP4 Marlin method exist only since 0.5.2x;
    # 0.5.23 is the version verified byte for byte. --tp-size / --ep-size are server_args' own names
    # (0.5.23, sglang/srt/arg_groups/fields/parallel.py); a bare --tp only works as an argparse abbreviation.
    "sglang": EngineFacts(
        "sglang", "SGLang", "sglang-L2", (0, 5, 23), "0.5.23", w4a8=False, global_dtype="act", scale_clamp=False,
        rescale=False, moe_backend_flag="--moe-runner-backend marlin", memory_flag="--mem-fraction-static",
        memory_profiled=False, serve="python -m sglang.launch_server --model-path {path}", tp_flag="--tp-size {tp}",
        ep_flag="--ep-size {ep}",
        sm120_moe_default="SGLang's DeepSeek-V4 default on sm_120 is flashinfer_mxfp4 (NVFP4: "
                          "flashinfer_trtllm_routed)",
        inner_methods=frozenset({("fp8", "deepseek_v4"), ("mxfp4", "gpt_oss"), ("modelopt_fp4", None),
                                 ("modelopt_mixed", "deepseek_v4"), ("compressed-tensors", None)})),
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


def shell_quote(text: str) -> str:
    """`text` as one shell word to paste: shlex's quoting, or bash's $'...' form when it holds a
    newline or another control character (which would otherwise break the printed line in two)."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in text):
        return shlex.quote(text)
    body = "".join(c if c.isprintable() and c not in "\\'" else
                   {"\n": "\\n", "\t": "\\t", "\\": "\\\\", "'": "\\'"}.get(c, f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}") for c in text)
    return f"$'{body}'"


def parallel_flags(engine: str, *, tp: int, ep: int = 1) -> str:
    """The engine's flags for a (TP, EP) split: every command line and message that names one uses these."""
    e = engine_facts(engine)
    return e.tp_flag.format(tp=tp) + (" " + e.ep_flag.format(ep=ep) if ep > 1 else "")


def launch_command(engine: str, path: str, *, tp: int, ep: int = 1, act_dtype: str | None = None,
                   memory: float | None = None) -> str:
    """The server command line for a checkpoint; `plan` and SERVING.md both print this one. The path is
    shell-quoted: a name with spaces, quotes or a newline stays one argument when pasted."""
    e = engine_facts(engine)
    parts = [e.serve.format(path=shell_quote(str(path))), parallel_flags(engine, tp=tp, ep=ep), e.moe_backend_flag]
    if memory is not None:
        parts.append(f"{e.memory_flag} {memory:.2f}")
    if act_dtype is not None:
        parts.append(f"--dtype {act_dtype}")
    parts.append("--trust-remote-code")
    return " ".join(parts)


def registration_log_line(engine: str, engine_version: str) -> str:
    """The exact line each plugin logs (at INFO) when it registers; docs/SERVING.md quotes it."""
    return f"dsv4-convert: registered quantization method '{QUANT_METHOD}' for {engine} {engine_version}"
