"""Issue 37 item 10: `plan` and SERVING.md's launch line never offer a TP the engine refuses for the
model: the divisibility rules of core/targets/parallel_rules.py, read from config.json (attention heads, KV heads,
linear-attention and Mamba-2 heads and groups). The rules themselves on config dicts; then `synth` replicas
whose config.json is given small head counts, through the real CLI (plan, a conversion's SERVING.md, --tp).

Substitution: the replicas' config.json head counts are edited after synth (synth writes 2 heads); plan and the
converter read the heads from config.json alone, as the engines do at launch. `--tp` at a refused split
converts as asked, with a warning."""

from __future__ import annotations

import json
import re

import pytest

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.targets.parallel_rules import split_dims, split_refusals
from tests.helpers.cli import run_cli


def _refused_tps(config: dict, engine: str) -> list[int]:
    dims = split_dims(config, engine)
    return [tp for tp in (1, 2, 3, 4, 8, 16) if split_refusals(dims, tp)]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("config, refused", [
    ({"num_attention_heads": 4, "num_key_value_heads": 4}, [3, 8, 16]),  # vLLM: heads % TP
    ({"num_attention_heads": 12, "num_key_value_heads": 3}, [2, 4, 8, 16]),  # QKV: 3 and 2 (4) divide neither way
    ({"num_attention_heads": 16, "num_key_value_heads": 2}, [3]),  # TP 4, 8: KV heads replicated (TP % KV == 0)
    ({"num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512}, [3]),  # MLA: no QKV rule
    ({"text_config": {"num_attention_heads": 6, "num_key_value_heads": 6}, "num_attention_heads": 64}, [4, 8, 16]),
    ({"num_attention_heads": 16, "num_key_value_heads": 16, "linear_num_key_heads": 16,
      "linear_num_value_heads": 4}, [3, 8, 16]),  # Qwen3-Next's delta-net heads
    ({"num_attention_heads": 16, "num_key_value_heads": 16, "mamba_num_heads": 4, "n_groups": 1,
      "mamba_n_groups": 1}, [3, 8, 16]),  # Nemotron-H's Mamba-2 heads; 1 group is replicated
    ({"num_attention_heads": 16, "num_key_value_heads": 16, "mamba_num_heads": 16, "n_groups": 2,
      "mamba_n_groups": 2}, [3, 4, 8, 16]),  # 2 groups over TP 4 are neither split nor 1
])
def test_the_rules(engine, config, refused):
    assert _refused_tps(config, engine) == refused


def test_a_config_without_heads_refuses_nothing():
    assert _refused_tps({"hidden_size": 256}, "vllm") == []


@pytest.fixture(scope="module")
def heads4(tmp_path_factory):
    """A qwen3-moe replica with 4 attention and 4 KV heads (its experts serve TP 8 / EP 8 unpadded)."""
    src = tmp_path_factory.mktemp("heads") / "qwen3-h4"
    run_cli("synth", src, "--family", "qwen3-moe", "-q")
    config = json.loads((src / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=4)
    (src / "config.json").write_text(json.dumps(config))
    return src


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_plan_never_recommends_a_tp_the_engine_refuses(heads4, engine):
    report = json.loads(run_cli("plan", heads4, "--gpus", "8", "--target", engine, "--json").stdout)
    assert report["recommended"]["tp"] == 4, report["recommended"]  # was TP 8
    assert re.search(r"(--tp-size|--tensor-parallel-size) 4 ", report["command"]), report["command"]
    for c in report["candidates"]:
        if c["tp"] == 8:
            assert not c["valid"] and any("4 attention heads" in r for r in c["reasons"]), c


@pytest.mark.slow
def test_serving_notes_and_tp_follow_the_engines_rules(heads4, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", heads4, out, "--target", "sglang", "--workers", "1", "-q")
    serving = (out / "SERVING.md").read_text()
    launch = next(ln for ln in serving.splitlines() if "--model-path" in ln)
    assert "--tp-size 4" in launch, launch
    assert "sglang refuses TP 8 / EP 8 for this model at launch (4 attention heads" in serving
    # --tp 8 asked for explicitly: converted as asked, the engine's refusal said up front and in SERVING.md
    proc = run_cli("nvfp4-to-marlin", heads4, tmp_path / "tp8", "--target", "vllm", "--tp", "8", "--workers", "1")
    assert "warning: vllm refuses TP 8 for this model at launch (4 attention heads" in proc.stderr, proc.stderr
    assert "vllm refuses TP 8 / EP 1 for this model at launch" in (tmp_path / "tp8" / "SERVING.md").read_text()
