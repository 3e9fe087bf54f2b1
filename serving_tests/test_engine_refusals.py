"""The engine's own reason, where core/served.py REFUSED says an engine release cannot serve a family x format
because it cannot load the SOURCE itself: the engine builds the source's model with its own construction and
loads it with its own loader (serving_tests/sglang/harness_refusal.py, the differential harness's set-up), and
the test passes only while that load fails with the quoted reason. If the engine ever loads it, the test fails:
the refusal is then stale and the family's differential case should run on that engine.

Substitutions: those of serving_tests/test_differential.py and serving_tests/sglang/harness_differential.py
(CPU stand-ins for engine steps, never the weight loading this test is about); the source is a
`dsv4-convert synth --family` replica built from the release's public facts (synth/families.py), not its weights.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from common import installed_engine, spawn_ranks
from differential import Case, make_source

ENGINE = installed_engine()
if ENGINE is None:
    pytest.skip("no engine installed (run serving_tests/run.sh)", allow_module_level=True)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).parent / ENGINE))


@pytest.mark.skipif(ENGINE != "sglang", reason="core/served.py REFUSED: SGLang 0.5.23 x llama4")
def test_sglang_cannot_load_the_modelopt_llama4_source_itself(tmp_path):
    """nvidia/Llama-4-Scout-17B-16E-Instruct-FP4 layout (ModelOpt's stacked K-major experts with per-expert block
    scales `feed_forward.experts.gate_up_proj_weight_scale` [E, K/16, 2I]): SGLang 0.5.23's Llama4ForConditionalGeneration
    (mllama4.py) routes that name through `_handle_expert_scale_params`, which takes it for one scale shared by
    all experts and writes it into every expert's slot: `param.data[expert_id] = loaded_weight` cannot broadcast
    the whole stack into one expert (RuntimeError, expand)."""
    src = make_source(tmp_path, Case("llama4", "nvfp4-modelopt-hf"))
    cases = {"llama4": {"source": str(src), "dtype": "bfloat16", "fmt": "nvfp4-modelopt-hf"}}
    (result,) = spawn_ranks("harness_refusal:run", {"cases": cases}, tmp_path, world=1)
    r = result["llama4"]
    assert "error" in r, f"SGLang loaded the ModelOpt Llama-4 source ({r}): core/served.py's refusal is stale"
    assert r["error"].startswith("RuntimeError:") and "expand" in r["error"], r
    assert "_handle_expert_scale_params" in r["traceback"] and "mllama4.py" in r["traceback"], r["traceback"]
