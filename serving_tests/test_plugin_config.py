"""Both plugins, in this process, where the engines agree (runs in each engine venv, parametrised by the
engine it finds): the engine's own plugin loader registers `marlin_fp4` once and logs it; the config
parser refuses a layout tag of the other engine, a missing or unknown one; and the config for the
non-expert layers is the one the engine builds for DeepSeek-V4's own block. No substitutions (the SGLang
import needs the torchvision stand-in of serving_tests/stubs, on the path by conftest.py)."""

from __future__ import annotations

import importlib
import logging
import os

import pytest
from common import installed_engine

import synth
from dsv4_convert.core.engines import ENGINES, registration_log_line
from dsv4_convert.core.target import MarlinTarget
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
