"""Real model shapes end to end through the CLI (subprocesses): a gpt-oss-20b-shaped layer (H = I = 2880)
is refused before any work on both engines, a DSV4 shape with I=256 converts and records the layouts
that work unpadded, and validate / plan give the same verdicts as the converter (formats/tiles.py).
The data is small random data at the real H and I (4 or 8 experts, one layer)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli


def _synth(factory, name: str, fmt: str, *, experts: int, hidden: int, intermediate: int):
    src = factory.mktemp("shapes") / name
    run_cli("synth", src, "--format", fmt, "--layers", 1, "--experts", experts, "--hidden", hidden,
            "--intermediate", intermediate, "--shards", 1, "--hash-layers", 0)
    return src


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    return _synth(tmp_path_factory, "gpt-oss-20b-layer", "mxfp4-gptoss", experts=4, hidden=2880, intermediate=2880)


@pytest.fixture(scope="module")
def dsv4_i256(tmp_path_factory):
    return _synth(tmp_path_factory, "dsv4-i256", "mxfp4-dsv4", experts=8, hidden=4096, intermediate=256)


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_gptoss_layer_is_refused_before_any_work(gptoss, tmp_path, target):
    out = tmp_path / "out"
    proc = run_cli("mxfp4-to-marlin", gptoss, out, "--target", target, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "convert.needs_padding" in proc.stderr and "H=2880, I=2880" in proc.stderr
    assert "pads them at TP 1 / EP 1" in proc.stderr  # the engine pads every split: serve the source
    assert "Traceback" not in proc.stderr and not out.exists()


def test_plan_on_gptoss_agrees_and_counts_stacked_experts_once(gptoss, tmp_path):
    report = tmp_path / "plan.json"
    for target in ("vllm", "sglang"):
        run_cli("plan", gptoss, "--gpus", 2, "--gpu-mem-gib", 96, "--target", target, "--report", report, check=False)
        plan = json.loads(report.read_text())
        assert all(c["tiles"] == "pad" and not c["tiles_ok"] for c in plan["candidates"])
        tp1 = next(c for c in plan["candidates"] if (c["tp"], c["ep"]) == (1, 1))
        assert tp1["padded"] == {"i_shard": 2944, "hidden": 3072}
        experts = plan["model"]["expert_bytes"]
        assert 50e6 < experts < 56e6 and plan["model"]["other_bytes"] >= 0  # 4 x 3 x 2880^2 / 2 + scales


def test_dsv4_i256_converts_and_records_the_unpadded_layouts(dsv4_i256, tmp_path):
    out = tmp_path / "out"
    run_cli("mxfp4-to-marlin", dsv4_i256, out, "--target", "sglang")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format_version"] == 2
    # MXFP4 per rank must be a multiple of 128: I=256 works at MoE TP 1 and 2 only
    assert qc["layouts"] == [{"tp": 1, "ep": 1}, {"tp": 2, "ep": 1}, {"tp": 2, "ep": 2}, {"tp": 4, "ep": 4},
                             {"tp": 8, "ep": 8}]
    serving = (out / "SERVING.md").read_text()
    # the experts allow all five, but the replica's 2 attention heads forbid TP 4 and 8 at launch (core/parallel_rules):
    # SERVING.md offers the three the engine accepts, names the two it refuses and why, and launches the largest
    assert "TP 1 / EP 1, TP 2 / EP 1, TP 2 / EP 2." in serving
    assert "refuses TP 4 / EP 4, TP 8 / EP 8 for this model at launch (2 attention heads" in serving
    assert "--tp-size 2 --moe-runner-backend marlin" in serving
    bad = run_cli("validate", out, "--tp", 8, check=False)
    assert bad.returncode != 0 and "structure.tile.tp" in bad.stdout + bad.stderr
    run_cli("validate", out, "--tp", 8, "--ep", 8)
