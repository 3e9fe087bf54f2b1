"""SGLang 0.5.23 plugin tests, on CPU, against SGLang's own code.

CPU substitutions (nothing an assertion compares comes from any of them):
- torchvision stand-in (serving_tests/stubs/torchvision): `import sglang` imports torchvision for
  multimodal preprocessing; PyPI's torchvision does not load beside CPU torch 2.13. Never called here.
- `override_platform(is_sm120=True)`: SGLang's DSv4 `Mxfp4MarlinMoEMethod` refuses to prepare
  Marlin weights unless the GPU is sm90/sm120; sm120 is the target, and it also selects the padding
  rule (non-Hopper: I -> 128, H -> 256) that the plugin's shape check mirrors.
- `--moe-runner-backend marlin` (server args + `initialize_moe_config()`): forces the Marlin MoE
  methods, as the documented launch command does.
- `marlin_utils_fp4.gptq_marlin_repack` -> the project's `to_marlin_weight`: the real op is a CUDA
  JIT kernel. It only runs in the engine's reference path (a); the golden cases
  (tests/formats/test_golden.py) pin `to_marlin_weight` to the engines' bytes, and the scale
  permutation/processing is SGLang's own Python in both paths.
- `marlin_make_workspace` -> a dummy tensor: it reads the CUDA SM count; the workspace is a runtime
  buffer, not a compared parameter.
- Parallel ranks are set with `get_parallel().override_permanently` on 2 spawned gloo ranks; SGLang's
  FusedMoE weight loader only reads the ranks (it communicates nothing while loading). On CPU SGLang's
  loader takes its `use_padded_loading` branch for both paths (a) and (b).
- The model's own name mapping (`DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format` +
  `FusedMoE.make_expert_params_mapping`) feeds a single FusedMoE layer instead of a whole model.
"""

from __future__ import annotations

import logging

import pytest
import synth
from common import spawn_ranks

from dsv4_convert.formats.marlin import MarlinTarget
from dsv4_convert.serving.config import PluginConfigError, registration_log_line

sglang = pytest.importorskip("sglang")

H, I, E = 256, 256, 4  # per-rank I: 128 at TP=2 (MXFP4 needs 128, NVFP4 64), 256 at EP=2


def _case(case_id, fmt, act_dtype, *, ep=False, **extra):
    return {
        "id": case_id,
        "fmt": fmt,
        "act_dtype": act_dtype,
        "ep": ep,
        "experts": E,
        "hidden": H,
        "inter": I,
        **extra,
    }


# codec-built converted tensors (serving_tests/synth.py): what the converter cannot be asked for
CASES = [
    # negative control: bytes converted for vLLM (bf16 rescale, fp32 globals) must NOT match SGLang's
    _case("negative-vllm-bytes", "nvfp4", "bfloat16", convert_for="vllm", small_scales=True),
]
EP_CASES = [_case("mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True)]

# the key cases on the real converter output: `dsv4-convert synth` + `*-to-marlin --target sglang`
CKPT_CASES = [
    _case("ckpt-mxfp4-bf16-tp2", "mxfp4", "bfloat16"),
    _case("ckpt-nvfp4-bf16-tp2", "nvfp4", "bfloat16"),
    _case("ckpt-nvfp4-fp16-tp2", "nvfp4", "float16"),
]
CKPT_EP_CASES = [_case("ckpt-nvfp4-bf16-ep2", "nvfp4", "bfloat16", ep=True)]


def _with_checkpoints(cases, tmp):
    out = []
    for c in cases:
        ckpt = synth.make_checkpoints(
            tmp,
            c["fmt"],
            engine="sglang",
            act_dtype=c["act_dtype"],
            experts=c["experts"],
            hidden=c["hidden"],
            inter=c["inter"],
        )
        out.append({**c, "checkpoints": list(ckpt)})
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case in one spawn of 2 gloo ranks (the engine import dominates the run time)."""
    tmp = tmp_path_factory.mktemp("ranks")
    cases = CASES + EP_CASES + _with_checkpoints(CKPT_CASES + CKPT_EP_CASES, tmp)
    return spawn_ranks("harness_sglang:run_cases", {"cases": cases}, tmp)


@pytest.fixture(scope="module")
def tp_results(results):
    return results


@pytest.fixture(scope="module")
def ep_results(results):
    return results


def _assert_equal(results, case_id, expected_local):
    for rank, res in enumerate(results):
        r = res[case_id]
        assert r["plugin_method"].startswith("Prepacked"), r
        assert r["local_experts"] == expected_local
        assert r["skipped"] == [], f"rank {rank}: converted tensors with no parameter: {r['skipped']}"
        bad = {k: v for k, v in r["diff"].items() if v is not None}
        assert not bad, f"rank {rank} {case_id}: {bad}"


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES + CKPT_CASES if not c["id"].startswith("negative")]
)
def test_tp2_plugin_params_byte_equal_engine(tp_results, case_id):
    _assert_equal(tp_results, case_id, expected_local=E)


def test_tp2_engine_path_is_sglang_marlin_method(tp_results):
    methods = {res[c["id"]]["engine_method"] for res in tp_results for c in CASES + CKPT_CASES}
    assert methods == {"Mxfp4MarlinMoEMethod", "ModelOptNvFp4FusedMoEMethod"}


def test_negative_control_wrong_target_differs(tp_results):
    for res in tp_results:
        diff = res["negative-vllm-bytes"]["diff"]
        assert diff["w13_weight"] is None  # weights are engine-independent...
        assert (
            diff["w13_weight_scale"] is not None and diff["w2_weight_scale"] is not None
        )  # ...scales are not


@pytest.mark.parametrize("case_id", [c["id"] for c in EP_CASES + CKPT_EP_CASES])
def test_ep2_plugin_params_byte_equal_engine(ep_results, case_id):
    _assert_equal(ep_results, case_id, expected_local=E // 2)


# --- discovery and config, in this process --------------------------------------------------------


def test_engine_plugin_loader_calls_register_once(monkeypatch, caplog):
    import sglang.srt.plugins as sgl_plugins
    from sglang.srt.layers.quantization import get_quantization_config

    import dsv4_convert.serving.sglang_plugin as plugin

    calls = []
    real = plugin.register
    monkeypatch.setattr(plugin, "register", lambda: calls.append(1) or real())
    monkeypatch.setattr(sgl_plugins, "_plugins_loaded", False)
    with caplog.at_level(logging.INFO, logger="dsv4_convert.serving"):
        sgl_plugins.load_plugins()
        sgl_plugins.load_plugins()
    assert len(calls) == 1
    cls = get_quantization_config("marlin_fp4")
    assert cls.__name__ == "SglangMarlinFp4Config" and cls.get_name(cls) == "marlin_fp4"
    assert registration_log_line("sglang", sglang.__version__) in caplog.text
    assert real() is True and get_quantization_config("marlin_fp4") is cls  # idempotent


def test_config_builds_inner_fp8_method_from_original():
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    from dsv4_convert.serving.sglang_plugin import register

    register()
    from sglang.srt.layers.quantization import get_quantization_config

    qc = synth.quant_config("mxfp4", MarlinTarget(engine="sglang"))
    cfg = get_quantization_config("marlin_fp4").from_config(qc)
    assert isinstance(cfg.inner, Fp8Config) and cfg.inner.weight_block_size == [128, 128]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"marlin_layout": "vllm-L4"}, "converted for vllm"),
        ({"marlin_layout": None}, "marlin_layout is missing"),
        ({"marlin_layout": "sglang-L9"}, "unknown"),
    ],
)
def test_config_refuses_wrong_or_missing_layout(change, message):
    from dsv4_convert.serving.sglang_plugin import register

    register()
    from sglang.srt.layers.quantization import get_quantization_config

    qc = {**synth.quant_config("nvfp4", MarlinTarget(engine="sglang")), **change}
    if change.get("marlin_layout") is None:
        del qc["marlin_layout"]
    with pytest.raises(PluginConfigError, match=message):
        get_quantization_config("marlin_fp4").from_config(qc)
