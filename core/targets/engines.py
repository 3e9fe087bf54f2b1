"""The one table of engine facts, per engine and per release (a version range): what each engine expects
of a converted checkpoint, how it is launched, where its code and kernels are, and what each release can
serve. Every consumer reads it: the converter, `plan`, validate, doctor, the kernel providers, the probe,
the SERVING.md writer, the CLI and both plugins. A behaviour that differs between engines or releases is
a field here, never an `engine == ...` test elsewhere; an engine or a version the table does not list is
a typed error (`engine.unknown`, `engine.version_unknown`), never another engine's rules.

Adding an engine or a release: CONTRIBUTING.md, "Add an engine or an engine version". Pure: no engine
import. formats/ imports nothing of the project, so the codecs and the tile rule get these facts as
values (`EngineFacts.padding` is a formats.tiles.EnginePadding).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ...formats.tiles import EnginePadding, PadRule
from ..errors import UsageError
from .inner_methods import resolve_sglang, resolve_vllm
from .kernel_table import SGLANG_0523_KERNELS, VLLM_033_KERNELS, VLLM_034_KERNELS, KernelOps

__all__ = [
    "ACT_DTYPES", "DEFAULT_ENGINE", "ENGINES", "EngramHost", "FORMAT_VERSION", "LAYOUTS", "MXFP4_NEEDS_BF16",
    "QUANT_METHOD", "READABLE_FORMAT_VERSIONS", "RELEASES", "EngineError", "EngineFacts", "KernelOps", "Package",
    "Release", "engine_facts", "engine_inner_method", "launch_command",
    "mxfp4_dtype_problem", "parallel_flags", "registration_log_line", "release", "release_for", "shell_quote",
    "version_tuple", "w4a8_problem",
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

class EngineError(UsageError, ValueError):
    """An engine or engine version the table does not list (exit 2). A ValueError too: the callers that
    turn a bad target value into their own error keep catching it."""


@dataclass(frozen=True, slots=True)
class Package:
    """An installed distribution doctor reads the version of."""
    dist: str  # distribution name (package metadata)
    module: str  # import name


@dataclass(frozen=True, slots=True)
class Release:
    """One engine release line: versions in [first, below) behave alike for dsv4-convert."""
    engine: str
    series: str  # the key's version part: "0.34" -> key "vllm 0.34"
    first: tuple[int, ...]  # lowest version of the range
    below: tuple[int, ...]  # first version past the range (not covered)
    verified: str  # the version the plugin and the layout were verified on
    w4a8: bool  # can serve a W4A8 (fp8 activations) Marlin checkpoint
    # after processing an NVFP4 MoE layer, the engine's own method keeps ModelOpt's fp32 input scales and (NVFP4 and
    # MXFP4) compressed-tensors' `w13/w2_weight_packed` (a second name of `w13/w2_weight`); False: input scales None
    keeps_moe_input_scales: bool
    kernels: KernelOps  # its Marlin MoE GEMM and repack

    @property
    def key(self) -> str:
        return f"{self.engine} {self.series}"

    def covers(self, version: str) -> bool:
        return self.first <= version_tuple(version) < self.below


@dataclass(frozen=True)
class EngramHost:
    """Where the engine keeps DeepSeek-V4.1's Engram tables (core/sources/side_tables.py), and how a launch picks:
    `host` in pinned host memory (the GPUs gather rows from it), or on the GPUs, sharded over TP.
    `on_host` / `on_gpu` turn the server command `{cmd}` into one with that placement."""
    default_on_host: bool
    on_host: str
    on_gpu: str


@dataclass(frozen=True, slots=True)
class EngineFacts:
    name: str
    display: str  # the engine's own spelling, for messages
    layout_tag: str  # dsv4-convert's name for the bytes this engine's Marlin preparation produces
    oldest: tuple[int, ...]  # oldest engine version that produces those bytes
    global_dtype: str  # dtype of the processed NVFP4 global: "F32", or "act" (the activation dtype)
    # NVFP4 block scales (docs/spec/MARLIN_FP4.md §3.3): True = processed values below 2 and every negative
    # scale become 0 (vLLM >= 0.20); False = the sign is dropped, |s| is served
    scale_clamp: bool
    rescale: bool  # with bf16 activations, a power-of-two factor per stacked tensor lifts the scales
    padding: EnginePadding  # how the engine rounds a rank's MoE sizes up (formats/tiles.py)
    moe_backend_flag: str  # forces the Marlin MoE runner
    memory_flag: str
    # True: the memory share covers activations and CUDA graphs too (the engine profiles them inside it);
    # False: a static pool for weights + KV cache, activations and graphs live outside it
    memory_profiled: bool
    serve: str  # launch prefix; {path} is the checkpoint
    tp_flag: str  # {tp} is the tensor-parallel size
    ep_flag: str  # {ep} is the expert-parallel size
    sm120_moe_default: str  # which MoE path the engine picks on sm_120 by itself (why the flag is needed)
    packages: tuple[Package, ...]  # what doctor reads; the first is the engine itself
    probe: str  # "module:function" that builds the engine's quantisation config (serving/probe.py)
    inner_method: object  # (block, model_type) -> the method the engine resolves a source block to
    # (which of those methods the plugins are proven with, per family and release: core/targets/served.py)
    # the config.json key of a Mamba-2 model's group count (core/targets/parallel_rules.py): vLLM's NemotronH reads
    # `n_groups`; SGLang 0.5.23's NemotronHConfig reads `mamba_n_groups` (default 8, which the release matches)
    mamba_groups_key: str = "n_groups"
    engram: EngramHost | None = None  # DeepSeek-V4.1's Engram tables: where they live and how to move them
    # compressed-tensors `format` (a source row's `ct_format`) -> the padding of the MoE method the engine builds
    # for such a source where it differs from `padding` (whose MXFP4 rule is the engine's native MXFP4 method's)
    ct_padding: tuple[tuple[str, EnginePadding], ...] = ()
    # compressed-tensors `format` -> model types whose architecture hook swaps such a block for the engine's native
    # method before it resolves the quantisation (vLLM 0.33 / 0.34 models/config.py KimiK3ForConditionalGenerationConfig:
    # `mxfp4-pack-quantized` -> quant_method mxfp4, Mxfp4MoEMethod): those sources get `padding`, not ct_padding
    native_ct: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def builds_ct_method(self, ct_format: str | None, model_type: str | None = None) -> bool:
        """Whether the engine builds its compressed-tensors MoE method for a source of compressed-tensors `ct_format`
        (None: not compressed-tensors) and `model_type`."""
        return ct_format is not None and model_type not in dict(self.native_ct).get(ct_format, ())

    def padding_for(self, ct_format: str | None) -> EnginePadding:
        """The padding of the MoE method the engine builds for a source of compressed-tensors `format` `ct_format`
        (None: not compressed-tensors, the native rule); core/sources/source_formats.py engine_padding reads a
        source format's. The plugin takes those sizes for its conversion, so the differential proof compares like
        with like."""
        return dict(self.ct_padding).get(ct_format, self.padding)

    @property
    def fp32_global(self) -> bool:
        return self.global_dtype == "F32"

    @property
    def releases(self) -> tuple[Release, ...]:
        """This engine's releases, oldest first."""
        return tuple(sorted((r for r in RELEASES.values() if r.engine == self.name), key=lambda r: r.first))

    @property
    def newest(self) -> Release:
        return self.releases[-1]

    @property
    def version(self) -> str:
        """The newest verified version: what a conversion records as its target engine version."""
        return self.newest.verified

    @property
    def w4a8(self) -> bool:
        """Some release of this engine serves W4A8 (`--w4a8` is a valid target)."""
        return any(r.w4a8 for r in self.releases)

    def w4a8_versions(self) -> str:
        """The releases that serve W4A8, for messages: `vLLM 0.33 (0.33.0)`."""
        return ", ".join(f"{self.display} {r.series} ({r.verified})" for r in self.releases if r.w4a8) or "none"

    def describe(self) -> str:
        """`vllm-L4` (vLLM >= 0.20, verified on 0.33.0, 0.34.0): the one line --help and docs print per target."""
        oldest = ".".join(map(str, self.oldest))
        verified = ", ".join(r.verified for r in self.releases)
        since = f">= {oldest}, verified on {verified}" if oldest != verified else verified
        return f"`{self.layout_tag}` ({self.display} {since})"


_VLLM_PAD = EnginePadding("vllm", {"nvfp4": PadRule(64, 1, "zeros", i_multiple_h_unaligned=128),
                                   "mxfp4": PadRule(128, 256, "zeros")})
# The MXFP4 rule above is vLLM's Mxfp4MoEMethod's (quant_method mxfp4 / DeepSeek-V4; fused_moe/oracle/mxfp4.py
# mxfp4_round_up_hidden_size_and_intermediate_size, Marlin: I -> 128, H -> 256). A compressed-tensors MXFP4 source
# gets CompressedTensorsW4A4Mxfp4MoEMethod instead (0.33.0 / 0.34.0 compressed_tensors_moe_w4a4_mxfp4.py), which
# has no maybe_roundup_sizes (FusedMoEMethodBase's keeps I; H only for DeepEP-style all2all) and creates
# `w13_weight_packed` [E, 2 I, H/2] at the layer's own sizes: it never pads, the kernel's tile rule alone decides.
_VLLM_CT_PAD = EnginePadding("vllm", {**_VLLM_PAD.rules, "mxfp4": None}, _VLLM_PAD.non_gated)
# NVFP4 non-gated experts (Nemotron-H, w13 = up alone): SGLang 0.5.23 prepare_moe_nvfp4_layer_for_marlin pads
# each rank's I with zeros to a multiple of 128 (`if not layer.moe_runner_config.is_gated`), gated ones never; the
# plugin creates that buffer and SGLang's loader zero-fills its tail (serving/sglang_methods.py). vLLM pads both
# kinds by its one NVFP4 rule.
_SGLANG_PAD = EnginePadding("sglang", {"nvfp4": None,
                                       "mxfp4": PadRule(128, 256, "uninitialised (torch.empty; dsv4-convert writes zeros)")},
                            non_gated={"nvfp4": PadRule(128, 1, "zeros", loader_fills=True)})

ENGINES = {
    # vllm-L4: vLLM >= 0.20 (docs/spec/MARLIN_FP4.md §9)
    "vllm": EngineFacts(
        "vllm", "vLLM", "vllm-L4", (0, 20, 0), global_dtype="F32", scale_clamp=True, rescale=True,
        padding=_VLLM_PAD, moe_backend_flag="--moe-backend marlin", memory_flag="--gpu-memory-utilization",
        memory_profiled=True, serve="vllm serve {path}", tp_flag="--tensor-parallel-size {tp}",
        ep_flag="--enable-expert-parallel",  # EP then spans the TP ranks
        sm120_moe_default="vLLM usually auto-selects Marlin on sm_120, but an SM100 path can still be picked "
                          "for NVFP4",
        packages=(Package("vllm", "vllm"),), ct_padding=(("mxfp4-pack-quantized", _VLLM_CT_PAD),),
        native_ct=(("mxfp4-pack-quantized", ("kimi_k3", "kimi_k31")),),
        probe="dsv4_convert.serving.probe:vllm_quant_config", inner_method=resolve_vllm,
        # vLLM 0.34 config/engram.py EngramConfig.cpu_offload = True ("Store embedding weights in pinned CPU memory
        # for UVA lookup"), set with --engram-config (engine/arg_utils.py); 0.33.0 the same
        engram=EngramHost(True, "{cmd}", """{cmd} --engram-config '{{"cpu_offload": false}}'""")),
    # sglang-L2: the NVFP4 Marlin fallback and the DSv4 MXFP4 Marlin method exist only since 0.5.2x;
    # 0.5.23 is the version verified byte for byte. --tp-size / --ep-size are server_args' own names
    # (0.5.23, sglang/srt/arg_groups/fields/parallel.py); a bare --tp only works as an argparse abbreviation.
    "sglang": EngineFacts(
        "sglang", "SGLang", "sglang-L2", (0, 5, 23), global_dtype="act", scale_clamp=False, rescale=False,
        padding=_SGLANG_PAD, mamba_groups_key="mamba_n_groups",
        moe_backend_flag="--moe-runner-backend marlin", memory_flag="--mem-fraction-static",
        memory_profiled=False, serve="python -m sglang.launch_server --model-path {path}", tp_flag="--tp-size {tp}",
        ep_flag="--ep-size {ep}",
        sm120_moe_default="SGLang's DeepSeek-V4 default on sm_120 is flashinfer_mxfp4 (NVFP4: "
                          "flashinfer_trtllm_routed)",
        # sglang 0.5.23 requires sglang-kernel==0.4.10 (import name sgl_kernel): its scalar types, no Marlin op
        packages=(Package("sglang", "sglang"), Package("sglang-kernel", "sgl_kernel")),
        probe="dsv4_convert.serving.probe:sglang_quant_config", inner_method=resolve_sglang,
        # SGLang 0.5.23 srt/environ.py SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE = EnvBool(False): "keep the tables in
        # host memory ... and gather rows from the GPU instead of sharding them over HBM" (layers/engram.py)
        engram=EngramHost(False, "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 {cmd}", "{cmd}")),
}
LAYOUTS = {e.layout_tag: e for e in ENGINES.values()}

# Releases, keyed "engine series". W4A8 Marlin (fp8 activations) is gone in vLLM 0.34.0: its kernels, the
# W4A8 repack and `marlin_quant_input`; VLLM_MARLIN_INPUT_DTYPE stops 0.34 at start-up.
RELEASES = {r.key: r for r in (
    Release("vllm", "0.33", (0, 33, 0), (0, 34, 0), "0.33.0", w4a8=True,
            keeps_moe_input_scales=False, kernels=VLLM_033_KERNELS),
    Release("vllm", "0.34", (0, 34, 0), (0, 35, 0), "0.34.0", w4a8=False,
            keeps_moe_input_scales=True, kernels=VLLM_034_KERNELS),
    # SGLang 0.5.23 ships no prebuilt Marlin op (sglang-kernel 0.4.10 has none): core/targets/kernel_table.py
    Release("sglang", "0.5.23", (0, 5, 23), (0, 5, 24), "0.5.23", w4a8=False, keeps_moe_input_scales=False,
            kernels=SGLANG_0523_KERNELS),
)}


def engine_facts(engine: str) -> EngineFacts:
    """The one check of an engine name."""
    try:
        return ENGINES[engine]
    except (KeyError, TypeError):
        raise EngineError(f"unknown engine {engine!r}; dsv4-convert knows {', '.join(sorted(ENGINES))}",
                          error_id="engine.unknown",
                          hint="pick one of those, or add the engine to core/targets/engines.py "
                               "(CONTRIBUTING.md, 'Add an engine or an engine version')") from None


def release(key: str) -> Release:
    """The release named `key` ("vllm 0.34", "sglang 0.5.23")."""
    if key not in RELEASES:
        engine_facts(key.split(" ")[0])  # an unknown engine says so
        raise EngineError(f"unknown release {key!r}; dsv4-convert knows {', '.join(RELEASES)}",
                          error_id="engine.version_unknown")
    return RELEASES[key]


def release_for(engine: str, version: str) -> Release:
    """The release that covers an installed `version` of `engine`, or EngineError naming the known ones."""
    facts = engine_facts(engine)
    for r in facts.releases:
        if r.covers(version):
            return r
    known = ", ".join(f"{r.series} ({r.verified})" for r in facts.releases)
    raise EngineError(
        f"{facts.display} {version} is not a release dsv4-convert knows ({facts.display} {known}): its serving "
        "code and kernels were never checked against this plugin", error_id="engine.version_unknown",
        hint=f"install {facts.display} {facts.newest.verified} (pip install '{facts.packages[0].dist}=="
             f"{facts.newest.verified}'), or add the release to core/targets/engines.py (CONTRIBUTING.md)")


def w4a8_problem(engine: str, version: str) -> str | None:
    """Why `engine` `version` cannot serve a W4A8 checkpoint (with the fix), or None when it can."""
    r, facts = release_for(engine, version), engine_facts(engine)
    if r.w4a8:
        return None
    return (f"this is a W4A8 (fp8 activations) checkpoint, and {facts.display} {version} has no W4A8 Marlin "
            f"kernels (W4A8 is served by: {facts.w4a8_versions()}). Convert the source again without --w4a8 "
            "(W4A16), or serve this one with a release listed.")


def engine_inner_method(engine: str, block: dict | None, model_type: str | None) -> str | None:
    """The method name `engine` resolves a source's quantisation `block` to (None: no block, the layers stay
    unquantised), by the engine's resolver (core/targets/inner_methods.py)."""
    facts = engine_facts(engine)
    return facts.inner_method(block, model_type) if isinstance(block, dict) else None


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
