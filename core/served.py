"""The one table of what the serving plugins are proven to load: family x source format x engine version.

An entry is servable exactly when its proof exists and passes: each entry names the serving_tests
node ids that load that family's converted checkpoint through the plugin with that engine version's own
code. The converter's gate (`convert.unservable_family`), validate's pre-flight (`marlin.serving_methods`),
`plan`, `doctor` and the README's support matrix all read this table and nothing else. A family, format or
engine version without an entry is not served, whatever its architecture string says; a checkpoint whose
architecture is in no family is not served either.

`methods` are the methods (core/inner_methods.py names) the engine built for the non-expert layers in
that proof: a source of the same family and format whose quantisation block resolves to another method
(ModelOpt MIXED_PRECISION where the proof had NVFP4) is not proven, so it is refused too.

serving_tests/conftest.py fails an engine's run when a proof of an entry for that engine version is
collected and does not pass; tests/core/test_served.py checks that every entry names a test that exists
and every proof case (serving_tests/families.py CASES) has its entry. Pure: no engine import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dsv4_convert.core.inner_methods import engine_inner_method
from dsv4_convert.core.naming import FAMILIES, Family, family_of

__all__ = ["Served", "SERVED", "ENGINE_VERSIONS", "engine_key", "entries", "source_block", "inner_method",
           "refusal", "checkpoint_refusal", "matrix_markdown", "MATRIX_BEGIN", "MATRIX_END"]

# the engine releases the serving proofs run under (serving_tests/locks), by core/engines.py release key
# ("<engine> <series>"); a release without rows here (vLLM 0.34 until its proofs run) serves nothing
ENGINE_VERSIONS = ("sglang 0.5.23", "vllm 0.33")


def engine_key(engine: str, version: str) -> str:
    """The release key of an installed `version` ("0.33.0" -> "vllm 0.33"); the version itself if no release
    of the table covers it (then nothing is served on it)."""
    for key in ENGINE_VERSIONS:
        name, series = key.split(" ")
        if name == engine and (version == series or version.startswith(series + ".")):
            return key
    return f"{engine} {version}"


def _engine_of(key: str) -> str:
    return key.split(" ", 1)[0]


@dataclass(frozen=True)
class Served:
    """One proven combination. `proofs`: the serving_tests node ids, each run in that engine version's venv."""
    family: str           # core/naming.py FAMILIES name
    source_format: str    # core/tensor_model.py SourceFormat value of the converted source
    engine: str           # release key: "vllm 0.33"
    methods: frozenset    # the engine's methods for the non-expert layers that the proof loaded
    proofs: tuple[str, ...]

    @property
    def engine_name(self) -> str:
        return _engine_of(self.engine)

    @property
    def version(self) -> str:
        return self.engine.split(" ", 1)[1]


_FAM = "serving_tests/test_families.py::"


def _whole_model(family: str, fmt: str) -> tuple[str, ...]:
    """The whole-model load of serving_tests/test_families.py (both tests, the case id `family-fmt`)."""
    return tuple(f"{_FAM}{t}[{family}-{fmt}]" for t in (
        "test_non_expert_layers_get_the_engines_own_methods",
        "test_routed_experts_get_the_plugin_method_and_every_tensor_a_parameter"))


def _dsv4(engine: str, case: str) -> tuple[str, ...]:
    return (f"serving_tests/{engine}/test_{engine}_plugin.py::test_tp2_plugin_params_byte_equal_engine[{case}]",
            "serving_tests/test_plugin_config.py::test_config_builds_the_engines_own_config_for_dsv4_fp8")


_GPT_OSS = {"vllm": "serving_tests/vllm/test_vllm_gpt_oss.py::test_gpt_oss_plugin_byte_equal_vllm_gpt_oss_marlin",
            "sglang": "serving_tests/sglang/test_sglang_gpt_oss.py::test_gpt_oss_plugin_byte_equal_sglang_gpt_oss_marlin"}
# the engines' own names of the same methods (core/inner_methods.py)
_DSV4_FP8 = {"vllm": "deepseek_v4_fp8", "sglang": "fp8"}
_GPT_OSS_MXFP4 = {"vllm": "gpt_oss_mxfp4", "sglang": "mxfp4"}


def _rows(key: str) -> tuple[Served, ...]:
    e = _engine_of(key)
    return (
        Served("deepseek-v4", "mxfp4-dsv4", key, frozenset({_DSV4_FP8[e]}), _dsv4(e, "ckpt-mxfp4-bf16-tp2")),
        Served("deepseek-v4", "nvfp4-modelopt-dsv4", key, frozenset({_DSV4_FP8[e]}), _dsv4(e, "ckpt-nvfp4-bf16-tp2")),
        Served("gpt-oss", "mxfp4-gptoss", key, frozenset({_GPT_OSS_MXFP4[e]}), (_GPT_OSS[e],)),
        Served("qwen3-moe", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               _whole_model("qwen3-moe", "nvfp4-modelopt-hf")),
        Served("qwen3-moe", "nvfp4-ct", key, frozenset({"compressed-tensors"}), _whole_model("qwen3-moe", "nvfp4-ct")),
        # also the hf_quant_config.json-only source (test_no_block_in_config_json_builds_modelopt_fp4_...)
        Served("glm4-moe", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               (*_whole_model("glm4-moe", "nvfp4-modelopt-hf"),
                f"{_FAM}test_no_block_in_config_json_builds_modelopt_fp4_from_hf_quant_config")),
        Served("glm4-moe", "nvfp4-ct", key, frozenset({"compressed-tensors"}), _whole_model("glm4-moe", "nvfp4-ct")),
    )


_DIFF = "serving_tests/test_differential.py::test_plugin_load_equals_the_engines_load_of_the_source"

# fam-hybrid: (family, source format, the engines' method for the non-expert layers, the engine releases whose
# differential proof (serving_tests/differential.py CASES, bf16) passes)
_HYBRID = (
    ("qwen3.5-moe", "nvfp4-modelopt-hf", "modelopt_mixed", ("vllm", "sglang")),
    ("qwen3.5-moe", "nvfp4-ct", "compressed-tensors", ("vllm", "sglang")),
    ("qwen3-next", "nvfp4-modelopt-hf", "modelopt_fp4", ("vllm", "sglang")),
    ("qwen3-next", "nvfp4-ct", "compressed-tensors", ("vllm", "sglang")),
    # SGLang 0.5.23 cannot load the ModelOpt source itself: mllama4.py _handle_expert_scale_params takes a
    # stacked `experts.gate_up_proj_weight_scale` for "a single scale for all experts" (RuntimeError: expand)
    ("llama4", "nvfp4-modelopt-hf", "modelopt_fp4", ("vllm",)),
    ("gemma4-moe", "nvfp4-modelopt-hf", "modelopt_fp4", ("vllm", "sglang")),
)


def _hybrid_rows(key: str) -> tuple[Served, ...]:
    return tuple(Served(family, fmt, key, frozenset({method}), (f"{_DIFF}[{family}-{fmt}-bfloat16]",))
                 for family, fmt, method, engines in _HYBRID if _engine_of(key) in engines)


# fam-mla / fam-hybrid: add a family's rows here (one per format and engine version) with the node ids of
# its differential proof, and its case to serving_tests/families.py CASES.
SERVED: tuple[Served, ...] = tuple(row for key in ENGINE_VERSIONS for row in (*_rows(key), *_hybrid_rows(key)))


def entries(family: str | None = None, source_format: str | None = None, engine: str | None = None) -> list[Served]:
    """The entries matching every given field; `engine` is an engine name ("vllm") or a release key."""
    return [s for s in SERVED if (family is None or s.family == family)
            and (source_format is None or s.source_format == source_format)
            and (engine is None or engine in (s.engine, s.engine_name))]


def source_block(config: Mapping, hf_quant_config: Mapping | None) -> dict | None:
    """The source's quantisation block the engines serve the non-expert layers from: config.json's
    `quantization_config`, and hf_quant_config.json only when config.json has none (both engines)."""
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        return qc
    return dict(hf_quant_config) if isinstance(hf_quant_config, Mapping) else None


def inner_method(engine: str, block: Mapping | None, model_type: str | None) -> str | None:
    return engine_inner_method(engine, dict(block) if isinstance(block, Mapping) else None, model_type)


def _proven(family: Family | None, fmt: str, engine: str) -> str:
    if family is None:
        return "nothing"
    rows = entries(family.name, engine=engine)
    if not rows:
        return f"no {engine} version for {family.name}"
    return "; ".join(f"{s.source_format} on {s.engine} with {'/'.join(sorted(s.methods))}" for s in rows)


def refusal(config: Mapping, source_format: str, engine: str, block: Mapping | None, *,
            method: str | None = None) -> str | None:
    """Why the plugins of `engine` (a name, or an engine-version key) are not proven to serve a conversion of
    this source, or None when some entry proves it: its family, its source format and the method the engine
    builds for its non-expert layers from `block` (source_block; `method`: the one an installed engine answered,
    for doctor). Convert, validate and doctor all ask this."""
    family = family_of(config)
    archs = config.get("architectures")
    if family is None:
        return (f"its architecture {archs!r} is in no model family dsv4-convert knows (core/naming.py FAMILIES), "
                "so no serving test has loaded it through the plugins")
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    rows = entries(family.name, source_format, engine)
    if not rows:
        return (f"no serving test loads a {family.name} checkpoint in {source_format} through the {engine} plugin "
                f"(proven for {family.name}: {_proven(family, source_format, engine)})")
    method = method or inner_method(_engine_of(engine), block, model_type)
    if any(method in s.methods for s in rows):
        return None
    return (f"{_engine_of(engine)} builds {method!r} for the non-expert layers of this {family.name} {source_format} "
            f"source (from its quantisation block), and the plugin was proven for it only with "
            f"{', '.join(sorted({m for s in rows for m in s.methods}))} ({', '.join(sorted({s.engine for s in rows}))})")


def checkpoint_refusal(config: Mapping, hf_quant_config: Mapping | None, source_format: str, engine: str) -> str | None:
    """`refusal` for a source checkpoint or for a conversion (source_format "marlin"), whose record names its
    source's format and blocks (core/converted_config.py serving_block: config.json's block, else the
    hf_quant_config.json one). `plan` asks this for each engine."""
    qc = config.get("quantization_config")
    if source_format != "marlin" or not isinstance(qc, dict):
        return refusal(config, source_format, engine, source_block(config, hf_quant_config))
    block = qc.get("original_quantization_config")
    block = block if block is not None else qc.get("original_hf_quant_config")
    return refusal(config, str(qc.get("source_format") or "unknown"), engine, block)


# ------------------------------------------------------------------------------------ the README's matrix
MATRIX_BEGIN = "<!-- served matrix: generated from core/served.py by matrix_markdown(); tests/core/test_served.py -->"
MATRIX_END = "<!-- end of served matrix -->"


def _proof_cell(rows: list[Served]) -> str:
    """The proving tests, by file and case: `test_families.py [qwen3-moe-nvfp4-ct]`."""
    cells: dict[str, set[str]] = {}
    for p in (p for s in rows for p in s.proofs):
        file, _, test = p.partition("::")
        cells.setdefault(file.removeprefix("serving_tests/"), set()).add(test.partition("[")[2].rstrip("]"))
    return "; ".join(f"`{f}`" + (f" [{', '.join(sorted(c - {''}))}]" if c - {""} else "") for f, c in cells.items())


def matrix_markdown() -> str:
    """The README's support matrix: every family, and for each source format the engine versions whose plugin
    is proven to serve it (with the method the engine builds for the non-expert layers) and the proof."""
    head = ["family", "releases", "source format", *ENGINE_VERSIONS, "proof (serving_tests/)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in FAMILIES:
        formats = list(dict.fromkeys(s.source_format for s in SERVED if s.family == f.name))
        if not formats:
            lines.append(f"| {f.name} | {f.examples} | | " + " | ".join("refused" for _ in ENGINE_VERSIONS)
                         + " | none: no serving test loads it yet |")
        for fmt in formats:
            rows = entries(f.name, fmt)
            cells = [next((f"served ({'/'.join(sorted(s.methods))})" for s in rows if s.engine == key), "refused")
                     for key in ENGINE_VERSIONS]
            lines.append(f"| {f.name} | {f.examples} | {fmt} | " + " | ".join(cells) + f" | {_proof_cell(rows)} |")
    return "\n".join([MATRIX_BEGIN, *lines, MATRIX_END])
