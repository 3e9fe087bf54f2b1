"""The served table (core/targets/served.py): every entry names a proof that exists, every proof case has its entry,
the README's matrix is the table, and the one verdict (`refusal`) is what the converter's gate, validate and
plan give: nothing is served because its architecture is unknown, nothing proven is refused.

Whether each proof passes is checked where the engines run: serving_tests/conftest.py fails an engine's run
when a proof of an entry for that engine release is collected and does not pass. No substitutions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dsv4_convert.core.sources.families import FAMILIES
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.core.targets.served import (
    ENGINE_VERSIONS,
    SERVED,
    _refused,
    engine_key,
    entries,
    refusal,
)
from dsv4_convert.core.targets.served_matrix import MATRIX_BEGIN, MATRIX_END, matrix_markdown
from dsv4_convert.synth.families import FAMILY_SPECS

ROOT = Path(__file__).resolve().parents[2]
# the keys the engines read to build a DeepSeek-V3-style model (core/targets/engine_config.py), as the releases carry them
ENGINE_KEYS = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
NVFP4_BLOCK = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
MIXED_BLOCK = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
               "quantized_layers": {"model.layers.0.mlp.experts.0.gate_proj": {"quant_algo": "NVFP4", "group_size": 16}}}


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _functions(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def _cases() -> set[tuple[str, str]]:
    """serving_tests/families.py CASES: the (family, format) pairs the whole-model proofs load."""
    for node in _module(ROOT / "serving_tests/families.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CASES" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("serving_tests/families.py has no CASES")


def _one_engine_cases() -> set[tuple[str, str]]:
    """serving_tests/families.py ONE_ENGINE_CASES: proofs that run on one engine only (the other refuses)."""
    for node in _module(ROOT / "serving_tests/families.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ONE_ENGINE_CASES" for t in node.targets):
            return {case for cases in ast.literal_eval(node.value).values() for case in cases}
    return set()


def _differential_cases() -> list[dict]:
    """serving_tests/differential.py CASES: Case(family, fmt, edit=, dtypes=, engines=) with literal arguments."""
    for node in _module(ROOT / "serving_tests/differential.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CASES" for t in node.targets):
            cases = []
            for call in node.value.elts:
                case = dict(zip(("family", "fmt", "edit", "dtypes", "engines"), map(ast.literal_eval, call.args)))
                case |= {k.arg: ast.literal_eval(k.value) for k in call.keywords}
                cases.append({"edit": None, "dtypes": ("bfloat16",), "engines": ("vllm", "sglang")} | case)
            return cases
    raise AssertionError("serving_tests/differential.py has no CASES")


def _differential_ids() -> set[str]:
    """As differential.Case.id: a producer's fixture name without its family, then the edit."""
    def tags(c):
        return (c["producer"].replace(f"-{c['family']}-", "-") if c.get("producer") else None, c.get("edit"))
    return {"-".join((c["family"], c["fmt"], *(t for t in tags(c) if t), d))
            for c in _differential_cases() for d in c["dtypes"]}


def test_every_entry_names_a_proof_that_exists():
    case_ids = {f"{fam}-{fmt}" for fam, fmt in _cases() | _one_engine_cases()} | _differential_ids()
    for s in SERVED:
        assert s.proofs, s
        for proof in s.proofs:
            file, _, test = proof.partition("::")
            name, _, param = test.partition("[")
            path = ROOT / file
            assert path.is_file(), proof
            assert name in _functions(_module(path)), proof
            param = param.rstrip("]")
            # a case id is written in the test file, or built from families.py CASES (test_families.py)
            assert not param or f'"{param}"' in path.read_text() or param in case_ids, proof


def test_every_refusal_names_a_test_node_that_exists():
    """A refusal quotes the engine's own reason and names the test that shows it (a node, never prose)."""
    from dsv4_convert.core.targets.served import REFUSED

    for r in REFUSED:
        file, sep, name = r.proof.partition("::")
        assert sep and (ROOT / file).is_file() and name.partition("[")[0] in _functions(_module(ROOT / file)), r


def test_every_proof_case_has_its_entry_on_every_release():
    for fam, fmt in _cases():
        family = FAMILY_SPECS[fam].family if fam in FAMILY_SPECS else fam  # a release replica (kimi-k2)
        for key in ENGINE_VERSIONS:
            assert entries(family, fmt, key), f"serving_tests/families.py proves {fam} {fmt}; no entry for {key}"


def test_every_differential_proof_has_its_entry_and_every_entry_a_differential_proof():
    """The differential proof (serving_tests/test_differential.py) is what makes an entry: each of its cases is an
    entry on every release of its engines, and each entry names the differential case of its family and format
    first."""
    from dsv4_convert.core.targets.served import _DIFF

    cases = _differential_cases()
    for c in cases:
        for key in ENGINE_VERSIONS:
            if key.split(" ")[0] in c["engines"]:
                family = FAMILY_SPECS[c["family"]].family if c["family"] in FAMILY_SPECS else c["family"]  # kimi-k2
                if _refused(family, c["fmt"], key):  # the release cannot load the source: no proof runs there
                    continue
                assert entries(family, c["fmt"], key), f"differential proof of {c} has no entry on {key}"
    for s in SERVED:
        differential = [p for p in s.proofs if p.startswith(_DIFF + f"[{s.family}-{s.source_format}")]
        assert differential and s.proofs[0] == differential[0], s


def test_entries_name_known_families_formats_and_releases_once():
    families = {f.name for f in FAMILIES}
    formats = set(FORMATS) - {"marlin"}
    assert all(s.family in families and s.source_format in formats and s.engine in ENGINE_VERSIONS
               for s in SERVED), [s for s in SERVED if s.engine not in ENGINE_VERSIONS]
    keys = [(s.family, s.source_format, s.engine) for s in SERVED]
    assert len(keys) == len(set(keys))
    assert all(s.methods for s in SERVED)


def test_readme_matrix_is_the_table():
    readme = (ROOT / "README.md").read_text()
    assert MATRIX_BEGIN in readme and MATRIX_END in readme
    block = readme[readme.index(MATRIX_BEGIN):readme.index(MATRIX_END) + len(MATRIX_END)]
    assert block == matrix_markdown(), (
        "README.md's support matrix differs from core/targets/served.py; paste the output of `python -c 'from "
        "dsv4_convert.core.targets.served_matrix import matrix_markdown; print(matrix_markdown())'`")


def test_an_architecture_in_no_family_is_not_served():
    config = {"architectures": ["SomethingNewForCausalLM"], "model_type": "x", "quantization_config": NVFP4_BLOCK}
    for engine in ("sglang", "vllm"):
        why = refusal(config, "nvfp4-modelopt-hf", engine, NVFP4_BLOCK)
        assert why and "'SomethingNewForCausalLM'" in why and "no model family" in why, why


@pytest.mark.parametrize("arch", ["DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "DeepseekV3ForCausalLM"])
def test_served_exactly_where_an_entry_proves_it(arch):
    """DeepSeek-V3.2 and Qwen3-Next converted with exit 0 and no proof: the verdict is the table's, whatever the
    architecture string."""
    from dsv4_convert.core.sources.families import family_of

    config = {"architectures": [arch], "model_type": "x", **ENGINE_KEYS}
    family = family_of(config)
    for engine in ("sglang", "vllm"):
        proven = family is not None and any("modelopt_fp4" in s.methods
                                            for s in entries(family.name, "nvfp4-modelopt-hf", engine))
        assert (refusal(config, "nvfp4-modelopt-hf", engine, NVFP4_BLOCK) is None) == proven


def test_every_entry_is_served_and_the_same_family_in_another_method_is_not():
    for s in SERVED:
        family = next(f for f in FAMILIES if f.name == s.family)
        config = {"architectures": [family.architectures[0]], **ENGINE_KEYS}
        # the block is not consulted when `method` is given: each proven method is served on its release
        for method in s.methods:
            assert refusal(config, s.source_format, s.engine, None, method=method) is None, s
        assert refusal(config, s.source_format, s.engine, None, method="not_a_method"), s


def test_qwen3_mixed_precision_is_served_only_where_its_proof_ran():
    """Qwen3-30B-A3B's ModelOpt MIXED_PRECISION export: proven on SGLang 0.5.23 (serving_tests/differential.py
    edit mixed-precision), refused on vLLM, where only NVFP4 is proven."""
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
    for engine in ("sglang", "vllm"):
        assert refusal(config, "nvfp4-modelopt-hf", engine, NVFP4_BLOCK) is None
    assert refusal(config, "nvfp4-modelopt-hf", "sglang 0.5.23", MIXED_BLOCK) is None
    why = refusal(config, "nvfp4-modelopt-hf", "vllm", MIXED_BLOCK)
    assert why and "'modelopt_mixed'" in why and "modelopt_fp4" in why, why


def test_an_installed_version_maps_to_its_release():
    assert engine_key("vllm", "0.33.0") == "vllm 0.33" and engine_key("sglang", "0.5.23") == "sglang 0.5.23"
    assert engine_key("vllm", "0.34.0") == "vllm 0.34" and entries(engine="vllm 0.34")
    from dsv4_convert.core.targets.engines import RELEASES

    assert set(ENGINE_VERSIONS) <= set(RELEASES)
    unknown = engine_key("vllm", "0.99.1")
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
    assert "no serving test" in refusal(config, "nvfp4-modelopt-hf", unknown, NVFP4_BLOCK)


def test_an_engines_own_refusal_is_quoted_by_the_gate_and_the_matrix(monkeypatch):
    from dsv4_convert.core.targets import served

    row = served.Refused("qwen3-moe", "mxfp4-ct", "sglang 0.5.23", "the engine's own words",
                         "serving_tests/test_families.py::test_x")
    monkeypatch.setattr(served, "REFUSED", (row,))
    config = {"architectures": ["Qwen3MoeForCausalLM"]}
    why = refusal(config, "mxfp4-ct", "sglang", {"quant_method": "compressed-tensors"})
    assert "sglang 0.5.23 itself cannot serve" in why and "the engine's own words" in why
    assert "refused by the engine" in matrix_markdown() and "the engine's own words" in matrix_markdown()
    for s in served.REFUSED:
        assert not served.entries(s.family, s.source_format, s.engine)  # never both served and refused


def test_a_source_config_the_engines_cannot_build_is_refused_with_their_reason():
    """ModelOpt 0.47 / llm-compressor 0.14 DeepSeek-V3 exports (transformers 5) lack keys both engines read:
    refused on SGLang for any checkpoint, on vLLM where the correction bias it would not create is stored."""
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    bias = ["model.layers.0.mlp.gate.e_score_correction_bias"]
    sglang = refusal(config, "nvfp4-modelopt-hf", "sglang", NVFP4_BLOCK, tensor_names=bias)
    assert sglang and "cannot build this source itself" in sglang and "moe_layer_freq" in sglang, sglang
    vllm = refusal(config, "nvfp4-modelopt-hf", "vllm 0.34", NVFP4_BLOCK, tensor_names=bias)
    assert vllm and "topk_method" in vllm and "KeyError" in vllm, vllm
    assert refusal(config, "nvfp4-modelopt-hf", "vllm 0.34", NVFP4_BLOCK) is None  # no bias stored: vLLM builds it
    for engine in ("sglang", "vllm"):
        assert refusal({**config, **ENGINE_KEYS}, "nvfp4-modelopt-hf", engine, NVFP4_BLOCK, tensor_names=bias) is None
