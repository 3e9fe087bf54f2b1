"""The engine table (core/targets/engines.py) is the only switch: a new entry alone reaches every consumer, and an
engine or version it does not list is a typed error everywhere, never another engine's rules.

Substitutions: the made-up engine "toyengine" and release "vllm 0.35" are added to the real table for the
length of a test (monkeypatch.setitem), which is the scenario under test. The toy engine's doctor package is
`pytest` (installed here, so doctor reads a real distribution's version), its probe is `_toy_probe` below (a
probe runs the engine's own config lookup, which a made-up engine does not have), and its kernel module
is `json` (importable, without Marlin ops: the provider must reach it and then say the ops are missing).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from dsv4_convert.core.errors import UsageError
from dsv4_convert.core.sources.source_formats import engine_padding
from dsv4_convert.core.targets.engines import (
    ENGINES,
    LAYOUTS,
    RELEASES,
    EngineError,
    KernelOps,
    Package,
    Release,
    engine_facts,
    engine_inner_method,
    launch_command,
    release,
    release_for,
    w4a8_problem,
)
from dsv4_convert.core.targets.kernel_table import GEMM_ARGS_034, REPACK_ARGS_034
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.tiles import IMPOSSIBLE, PAD, EnginePadding, PadRule, moe_rank_tiles
from dsv4_convert.serving.config import PluginConfigError, check_layout, check_rank_shape, parse_quant_config
from dsv4_convert.serving.probe import probe
from dsv4_convert.validate.kernel_provider import providers, select_provider

ROOT = Path(__file__).resolve().parents[2]
PYTEST_VERSION = version("pytest")


def _toy_probe(path: str) -> dict:
    return {"version": "1.0", "quant": type("ToyConfig", (), {"inner_method": f"toy:{path}"})()}


def _toy_resolver(block: dict, model_type: str | None) -> str | None:
    return f"toy_{block.get('quant_method')}_{model_type}"


TOY = dataclasses.replace(
    ENGINES["sglang"], name="toyengine", display="ToyEngine", layout_tag="toy-L1", oldest=(1, 0),
    padding=EnginePadding("toyengine", {"nvfp4": PadRule(256, 1, "zeros"), "mxfp4": None}),
    serve="toy serve {path}", tp_flag="--toy-tp {tp}", moe_backend_flag="--toy-moe marlin",
    packages=(Package("pytest", "pytest"),),
    probe=f"{__name__}:_toy_probe", inner_method=_toy_resolver)
TOY_RELEASE = Release("toyengine", "1", (1, 0), (1_000_000,), PYTEST_VERSION, w4a8=False, keeps_moe_input_scales=False,
                      kernels=KernelOps("toy_kernel", "extension", "pytest", "json", "toy:gemm", "toy:repack",
                                        GEMM_ARGS_034, REPACK_ARGS_034, "json", "pytest", "id"))
VLLM_035 = dataclasses.replace(RELEASES["vllm 0.34"], series="0.35", first=(0, 35, 0), below=(0, 36, 0),
                               verified="0.35.0", w4a8=True)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ENGINES, "toyengine", TOY)
    monkeypatch.setitem(LAYOUTS, "toy-L1", TOY)
    monkeypatch.setitem(RELEASES, TOY_RELEASE.key, TOY_RELEASE)


def _spec(layout: str, w4a8: bool = False):
    qc = {"quant_method": "marlin_fp4", "format_version": 2, "marlin_layout": layout, "act_dtype": "bfloat16",
          "w4a8": w4a8, "experts": {"layers.0.ffn.experts": "mxfp4"}, "source_format": "mxfp4-dsv4"}
    return parse_quant_config(qc)


def test_a_new_release_alone_reaches_every_consumer(monkeypatch):
    assert release_for("vllm", "0.34.2").key == "vllm 0.34"
    with pytest.raises(EngineError) as e:
        release_for("vllm", "0.35.1")
    assert e.value.error_id == "engine.version_unknown" and "0.33 (0.33.0), 0.34 (0.34.0)" in e.value.message
    with pytest.raises(PluginConfigError, match="not a release dsv4-convert knows"):
        check_layout(_spec("vllm-L4"), engine="vllm", engine_version="0.35.1")

    monkeypatch.setitem(RELEASES, VLLM_035.key, VLLM_035)  # the one change: a table entry
    assert release_for("vllm", "0.35.1") is VLLM_035 and release("vllm 0.35") is VLLM_035
    assert engine_facts("vllm").newest is VLLM_035 and engine_facts("vllm").version == "0.35.0"
    assert "0.35.0" in engine_facts("vllm").describe() and "vLLM 0.35 (0.35.0)" in engine_facts("vllm").w4a8_versions()
    check_layout(_spec("vllm-L4", w4a8=True), engine="vllm", engine_version="0.35.1")  # served, W4A8 too
    assert MarlinTarget(engine="vllm").engine_version == "0.35.0"


def test_w4a8_follows_each_release():
    assert w4a8_problem("vllm", "0.33.0") is None
    why = w4a8_problem("vllm", "0.34.0")
    assert "vLLM 0.34.0 has no W4A8 Marlin" in why and "without --w4a8" in why and "vLLM 0.33 (0.33.0)" in why
    check_layout(_spec("vllm-L4", w4a8=True), engine="vllm", engine_version="0.33.0")
    with pytest.raises(PluginConfigError, match="has no W4A8 Marlin kernels.*without --w4a8"):
        check_layout(_spec("vllm-L4", w4a8=True), engine="vllm", engine_version="0.34.0")


def test_a_new_engine_alone_reaches_every_consumer(toy, tmp_path):
    from dsv4_convert.cli.doctor import Doctor, _engines

    target = MarlinTarget(engine="toyengine")
    assert (target.layout_tag, target.engine_version) == ("toy-L1", PYTEST_VERSION)
    assert launch_command("toyengine", "ck pt", tp=2) == "toy serve 'ck pt' --toy-tp 2 --toy-moe marlin --trust-remote-code"
    assert engine_inner_method("toyengine", {"quant_method": "fp8"}, "m") == "toy_fp8_m"
    tiles = moe_rank_tiles("nvfp4", engine_facts("toyengine").padding, hidden=256, intermediate=256, tp=2)
    assert tiles.status == PAD and tiles.i_pad == 256 and "toyengine pads" in tiles.reason
    with pytest.raises(PluginConfigError, match="toyengine pads"):
        check_rank_shape("nvfp4", "toyengine", intermediate=256, hidden=256, tp_size=2)
    check_layout(_spec("toy-L1"), engine="toyengine", engine_version=PYTEST_VERSION)
    assert probe(str(tmp_path), "toyengine")["inner_method"] == f"toy:{tmp_path}"
    d = Doctor()
    _engines(d, None)
    assert d.engines["pytest"] == PYTEST_VERSION and d.releases["toyengine"]["release"] == "toyengine 1"
    assert "toy_kernel" in providers()
    with pytest.raises(UsageError, match="toy_kernel is installed but its Marlin MoE op"):
        select_provider("toy_kernel", "toy-L1")


def test_vllm_pads_mxfp4_experts_as_the_method_it_builds_for_the_source():
    """vLLM's Mxfp4MoEMethod (gpt-oss, DeepSeek-V4) rounds I -> 128 and H -> 256; the compressed-tensors MXFP4 method
    it builds for an llm-compressor source never pads (core/targets/engines.py _VLLM_CT_PAD), so its conversion is
    layout-agnostic at H 128 and the plugin takes those sizes; SGLang has one MXFP4 rule."""
    native = moe_rank_tiles("mxfp4", engine_padding("vllm", "mxfp4-dsv4"), hidden=128, intermediate=128)
    assert native.status == PAD and native.h_pad == 256
    assert moe_rank_tiles("mxfp4", engine_padding("vllm", "mxfp4-ct"), hidden=128, intermediate=128).ok
    # no padding: the kernel's tile rule alone decides (w2 K = I_shard 96 fits neither tile), where Mxfp4MoEMethod pads
    assert moe_rank_tiles("mxfp4", engine_padding("vllm", "mxfp4-ct"), hidden=128, intermediate=96).status == IMPOSSIBLE
    assert moe_rank_tiles("mxfp4", engine_padding("vllm", None), hidden=128, intermediate=96).status == PAD
    assert engine_padding("sglang", "mxfp4-ct") is engine_facts("sglang").padding
    assert engine_padding("vllm", "nvfp4-ct") is engine_padding("vllm", "mxfp4-gptoss") is engine_facts("vllm").padding
    check_rank_shape("mxfp4", "vllm", intermediate=128, hidden=128, tp_size=1, source_format="mxfp4-ct")
    with pytest.raises(PluginConfigError, match="H 128 -> 256"):
        check_rank_shape("mxfp4", "vllm", intermediate=128, hidden=128, tp_size=1, source_format="mxfp4-gptoss")


@pytest.mark.parametrize("consumer", [
    lambda: engine_facts("tensorrt"),
    lambda: release_for("tensorrt", "1.0"),
    lambda: release("tensorrt 1.0"),
    lambda: MarlinTarget(engine="tensorrt"),
    lambda: launch_command("tensorrt", "x", tp=1),
    lambda: engine_inner_method("tensorrt", {"quant_method": "fp8"}, None),
    lambda: check_rank_shape("nvfp4", "tensorrt", intermediate=256, hidden=256, tp_size=1),
    lambda: w4a8_problem("tensorrt", "1.0"),
])
def test_an_engine_outside_the_table_is_a_typed_error(consumer):
    with pytest.raises(EngineError) as e:
        consumer()
    assert e.value.error_id == "engine.unknown" and e.value.exit_code == 2 and "tensorrt" in e.value.message


def test_the_probe_refuses_an_engine_outside_the_table():
    with pytest.raises(EngineError):
        probe(".", "tensorrt")


def test_lock_files_and_venv_builds_are_the_tables_releases():
    """serving_tests/locks/ENGINE-VERSION-cpu-test.lock and build_venvs.sh's pins name exactly the table's
    verified releases: the CPU suites run every release the plugin claims to serve."""
    locks = {re.match(r"(\w+)-([\d.]+)-cpu-test\.lock", p.name).groups()
             for p in (ROOT / "serving_tests" / "locks").glob("*.lock")}
    assert locks == {(r.engine, r.verified) for r in RELEASES.values()}
    script = (ROOT / "serving_tests" / "build_venvs.sh").read_text()
    pins = set(re.findall(r"build [\w.-]+ +(\w+)==([\d.]+) +\1-\2-cpu-test\.lock", script))
    assert pins == locks


def _code_strings(path: Path):
    """String constants of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.lineno, n.value


def test_no_engine_literal_outside_the_table():
    """Engine names and layout tags appear in code only in core/targets/engines.py and in an engine's own plugin
    modules (serving/<engine>_*.py, which name their own engine and no other)."""
    names = {e.name for e in ENGINES.values()} | set(LAYOUTS) | {r.kernels.provider for r in RELEASES.values()}
    folders = ("cli", "convert", "core", "formats", "runtime", "serving", "synth", "validate")
    bad = []
    for path in sorted(p for f in folders for p in (ROOT / f).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("core/targets/engines.py", "core/targets/kernel_table.py"):  # the table and its kernel part
            continue
        own = next((e for e in ENGINES if path.name.startswith(f"{e}_") and rel.startswith("serving/")), None)
        bad += [f"{rel}:{line}: {text!r}" for line, text in _code_strings(path) if text in names and text != own]
        bad += [f"{rel}: engine == ..." for m in re.finditer(r"engine\s*==\s*['\"]", path.read_text())]
    assert not bad, "\n".join(bad)
