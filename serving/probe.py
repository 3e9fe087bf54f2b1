"""Ask the installed engine itself how it would serve a converted checkpoint, without loading weights:
its own quantisation lookup builds the plugin's config from config.json (and, inside it, the engine's
config for the non-expert layers). `dsv4-convert doctor PATH` runs this in a subprocess
(`python -m dsv4_convert.serving.probe PATH ENGINE`), so that doctor itself imports no engine.
Prints one JSON object: {"engine", "version", "config", "inner", "inner_method"} or {"engine", "error"}.
Which function asks which engine is the engine table's `probe` field (core/targets/engines.py)."""

from __future__ import annotations

import importlib
import json
import os
import sys

from ..core.targets.engines import engine_facts

__all__ = ["probe", "sglang_quant_config", "vllm_quant_config"]


def vllm_quant_config(path: str) -> dict:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cuda")
    import vllm
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader.weight_utils import get_quant_config
    from vllm.plugins import load_general_plugins

    from .vllm_plugin import register

    load_general_plugins()
    register()
    model_config = ModelConfig(model=path, skip_tokenizer_init=True, enforce_eager=True)
    quant = get_quant_config(model_config, LoadConfig())  # what VllmConfig builds at engine start
    return {"version": vllm.__version__, "quant": quant}


def sglang_quant_config(path: str) -> dict:
    import sglang
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.plugins import load_plugins

    from .sglang_plugin import register

    load_plugins()
    register()
    model_config = ModelConfig(path)
    return {"version": sglang.__version__, "quant": _get_quantization_config(model_config, LoadConfig())}


def probe(path: str, engine: str) -> dict:
    module, _, function = engine_facts(engine).probe.partition(":")  # an unknown engine: EngineError
    try:
        got = getattr(importlib.import_module(module), function)(path)
    except Exception as e:  # noqa: BLE001 - the answer is what the engine raised, as it would at launch
        return {"engine": engine, "error": f"{type(e).__name__}: {e}"}
    quant = got.pop("quant")
    return {"engine": engine, **got, "config": type(quant).__name__,
            "inner": type(getattr(quant, "inner", None)).__name__,
            "inner_method": getattr(quant, "inner_method", None)}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2])))
