"""Both plugins, in this process, where the engines agree (runs in each engine venv, parametrised by the
engine it finds): the engine's own plugin loader registers `marlin_fp4` once and logs it; the config
parser refuses a layout tag of the other engine, a missing or unknown one; the config for the
non-expert layers is the one the engine builds for DeepSeek-V4's own block; and the engine's own start-up
(vLLM's VllmConfig, SGLang's ModelConfig and `_get_quantization_config`, from a converted checkpoint's
folder) refuses every rescale factor the vLLM plugin would act on wrongly. Substitutions: the SGLang import
needs the torchvision stand-in of serving_tests/stubs (on the path by conftest.py); vLLM 0.34's x86 CPU
check for Triton is lifted for the start-up tests (serving_tests/vllm/cpu_platform.py says why)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from pathlib import Path

import pytest
from common import installed_engine
from differential import Case, make_case

import synth
from dsv4_convert.core.targets.engines import ENGINES, registration_log_line
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.serving.config import PluginConfigError

ENGINE = installed_engine()
if ENGINE is None:
    pytest.skip("no engine installed (run serving_tests/run.sh)", allow_module_level=True)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
OTHER = next(e for e in ENGINES if e != ENGINE)

# engine -> (plugin loader module, its "already loaded" flag, loader function, our config class,
#            the engine's own class for DeepSeek-V4's FP8 block and where it lives)
LOADERS = {
    "vllm": ("vllm.plugins", "plugins_loaded", "load_general_plugins", "VllmMarlinFp4Config",
             "vllm.models.deepseek_v4", "DeepseekV4FP8Config"),
    "sglang": ("sglang.srt.plugins", "_plugins_loaded", "load_plugins", "SglangMarlinFp4Config",
               "sglang.srt.layers.quantization.fp8", "Fp8Config"),
}


def _plugin():
    return importlib.import_module(f"dsv4_convert.serving.{ENGINE}_plugin")


def _config_class():
    _plugin().register()
    if ENGINE == "vllm":
        from vllm.model_executor.layers.quantization import get_quantization_config
    else:
        from sglang.srt.layers.quantization import get_quantization_config
    return get_quantization_config("marlin_fp4")


def test_engine_plugin_loader_calls_register_once(monkeypatch, caplog):
    module_name, flag, load, cls_name, *_ = LOADERS[ENGINE]
    loader = importlib.import_module(module_name)
    plugin = _plugin()
    calls = []
    real = plugin.register
    monkeypatch.setattr(plugin, "register", lambda: calls.append(1) or real())
    monkeypatch.setattr(loader, flag, False)
    with caplog.at_level(logging.INFO, logger="dsv4_convert.serving"):
        getattr(loader, load)()
        getattr(loader, load)()
    assert len(calls) == 1
    cls = _config_class()
    assert cls.__name__ == cls_name and cls.get_name(cls) == "marlin_fp4"
    version = importlib.import_module(ENGINE).__version__
    assert registration_log_line(ENGINE, version) in caplog.text
    assert real() is True and _config_class() is cls  # idempotent


def test_config_builds_the_engines_own_config_for_dsv4_fp8():
    *_, module_name, inner_name = LOADERS[ENGINE]
    cfg = _config_class().from_config(synth.quant_config("mxfp4", MarlinTarget(engine=ENGINE)))
    assert type(cfg.inner) is getattr(importlib.import_module(module_name), inner_name)
    assert cfg.inner_method == {"vllm": "deepseek_v4_fp8", "sglang": "fp8"}[ENGINE]


@pytest.mark.parametrize("tag, message", [
    (ENGINES[OTHER].layout_tag, f"converted for {OTHER}"),
    (None, "marlin_layout is missing"),
    (f"{ENGINE}-L9", "unknown"),
])
def test_config_refuses_wrong_or_missing_layout(tag, message):
    qc = {**synth.quant_config("nvfp4", MarlinTarget(engine=ENGINE)), "marlin_layout": tag}
    if tag is None:
        del qc["marlin_layout"]
    else:
        qc.pop("target_engine")  # the tag alone decides: a block naming the other engine is converted for it
    with pytest.raises(PluginConfigError, match=message):
        _config_class().from_config(qc)


# issue 37 item 6: a factor the vLLM plugin would re-encode every block scale of a stack by (serving/vllm_methods.py
# rank_rescale): Infinity turned 2048 of 2048 scale bytes to 0 at start-up, with no error
BAD_RESCALE = [float("inf"), float("-inf"), float("nan"), 1e300, 3.0, 0, -2.0, 2.0 ** 18, 0.5, True, "2", None]


def _engine_startup_quant_config(path):
    """The engine's own start-up from a checkpoint folder, as `vllm serve` / `sglang.launch_server` resolve it."""
    if ENGINE == "vllm":
        sys.path.insert(0, str(Path(__file__).parent / "vllm"))
        from cpu_platform import allow_x86_without_triton
        from vllm.config import KernelConfig, ModelConfig, VllmConfig
        from vllm.plugins import load_general_plugins

        allow_x86_without_triton()  # the test machine's CPU, not the plugin: cpu_platform.py
        load_general_plugins()
        model_config = ModelConfig(model=str(path), dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True)
        return VllmConfig(model_config=model_config, kernel_config=KernelConfig(moe_backend="marlin")).quant_config
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return _get_quantization_config(ModelConfig(str(path), dtype="bfloat16"), LoadConfig())


@pytest.fixture(scope="module")
def converted(case_dir):
    return make_case(case_dir, Case("qwen3-moe", "nvfp4-modelopt-hf"), ENGINE, "bfloat16")[1]


def test_engine_startup_accepts_the_converted_record(converted):
    assert type(_engine_startup_quant_config(converted)) is _config_class()


@pytest.mark.parametrize("value", BAD_RESCALE, ids=repr)
def test_engine_startup_refuses_every_bad_rescale_factor(converted, tmp_path, value):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in converted.iterdir():  # the same checkpoint; only config.json differs
        if f.name != "config.json":
            (bad / f.name).symlink_to(f)
    config = json.loads((converted / "config.json").read_text())
    key = f"{sorted(config['quantization_config']['experts'])[0]}.w13"
    config["quantization_config"]["rescale_factors"][key] = value
    (bad / "config.json").write_text(json.dumps(config))  # Infinity / NaN as a JSON file holds them
    with pytest.raises(ValueError) as e:  # vLLM wraps the plugin's error in its config's ValidationError
        _engine_startup_quant_config(bad)
    assert "[converted_config.rescale_factor]" in str(e.value) and repr(key) in str(e.value), str(e.value)


def test_config_answers_the_inner_configs_fields_for_dsv41():
    """DeepSeek-V4.1's model reads the quantisation config's `weight_block_size` while it builds and loads (vLLM
    0.34: [32, 32] with FP4 experts names the dense FP8 scales `weight_scale`, models/deepseek_v41/nvidia/model.py
    _linear_scale_param_name; the shared experts' TP padding reads it too): the plugin's config answers with the
    inner config's value, as the engine's own config for the source would."""
    from dsv4_convert.synth.dsv41 import dsv41_config
    from dsv4_convert.synth.layouts import Dims

    block = dsv41_config(Dims(2, 8, 256, 128, 0, False))["quantization_config"]
    qc = {**synth.quant_config("mxfp4", MarlinTarget(engine=ENGINE), original=block), "model_type": "deepseek_v41",
          "expert_dtype": block["expert_dtype"]}
    cfg = _config_class().from_config(qc)
    assert list(cfg.inner.weight_block_size) == [32, 32]
    assert list(cfg.weight_block_size) == [32, 32]
    with pytest.raises(AttributeError):
        cfg.no_such_field_anywhere  # noqa: B018 - what neither config has is still an AttributeError
    if ENGINE == "vllm":
        from types import SimpleNamespace

        from vllm.models.deepseek_v41.nvidia.model import _linear_scale_param_name

        # the VllmConfig holds only what the function reads (its quant_config): the engine's own function decides
        assert _linear_scale_param_name(SimpleNamespace(quant_config=cfg), "fp4") == "weight_scale"
