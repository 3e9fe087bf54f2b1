"""Real model shapes end to end through the real CLI command lines: a gpt-oss-20b-shaped layer (H = I = 2880)
is refused before any work on both engines, a DSV4 shape with I=256 converts and records the layouts
that work unpadded, and validate / plan give the same verdicts as the converter (formats/tiles.py).
The data is small random data at the real H and I (4 or 8 experts, one layer). Substitution: the command lines run
in one CLI process, in order (run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout
and stderr), not one process each: a process start costs more than most of these commands."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli_batch

TARGETS = ["vllm", "sglang"]


def _synth(src, fmt: str, *, experts: int, hidden: int, intermediate: int) -> list:
    return ["synth", src, "--format", fmt, "--layers", 1, "--experts", experts, "--hidden", hidden,
            "--intermediate", intermediate, "--shards", 1, "--hash-layers", 0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """step -> the CLI's answer, and "dir" -> the folder: the two sources synthesised (gpt-oss-20b-layer: 4 experts,
    H = I = 2880; dsv4-i256: 8 experts, H 4096, I 256), then every test's command lines, all in one CLI process."""
    d = tmp_path_factory.mktemp("shapes")
    gptoss, dsv4 = d / "gpt-oss-20b-layer", d / "dsv4-i256"
    out = d / "dsv4-out"
    steps = {"synth-gptoss": _synth(gptoss, "mxfp4-gptoss", experts=4, hidden=2880, intermediate=2880),
             "synth-dsv4": _synth(dsv4, "mxfp4-dsv4", experts=8, hidden=4096, intermediate=256),
             **{("refused", t): ["mxfp4-to-marlin", gptoss, d / f"gptoss-out-{t}", "--target", t] for t in TARGETS},
             **{("plan", t): ["plan", gptoss, "--gpus", 2, "--gpu-mem-gib", 96, "--target", t, "--report",
                              d / f"plan-{t}.json"] for t in TARGETS},
             "convert": ["mxfp4-to-marlin", dsv4, out, "--target", "sglang"],
             "validate-tp8": ["validate", out, "--tp", 8],
             "validate-tp8-ep8": ["validate", out, "--tp", 8, "--ep", 8]}
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), d)))
    for step in ("synth-gptoss", "synth-dsv4"):
        assert runs[step].returncode == 0, runs[step].stderr
    return {**runs, "dir": d}


@pytest.mark.parametrize("target", TARGETS)
def test_gptoss_layer_is_refused_before_any_work(runs, target):
    out = runs["dir"] / f"gptoss-out-{target}"
    proc = runs["refused", target]
    assert proc.returncode == 4, proc.stderr
    assert "convert.needs_padding" in proc.stderr and "H=2880, I=2880" in proc.stderr
    assert "pads them at TP 1 / EP 1" in proc.stderr  # the engine pads every split: serve the source
    assert "Traceback" not in proc.stderr and not out.exists()


def test_plan_on_gptoss_agrees_and_counts_stacked_experts_once(runs):
    for target in TARGETS:
        plan = json.loads((runs["dir"] / f"plan-{target}.json").read_text())
        assert all(c["tiles"] == "pad" and not c["tiles_ok"] for c in plan["candidates"])
        tp1 = next(c for c in plan["candidates"] if (c["tp"], c["ep"]) == (1, 1))
        assert tp1["padded"] == {"i_shard": 2944, "hidden": 3072}
        experts = plan["model"]["expert_bytes"]
        assert 50e6 < experts < 56e6 and plan["model"]["other_bytes"] >= 0  # 4 x 3 x 2880^2 / 2 + scales


def test_dsv4_i256_converts_and_records_the_unpadded_layouts(runs):
    out = runs["dir"] / "dsv4-out"
    assert runs["convert"].returncode == 0, runs["convert"].stderr
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
    bad = runs["validate-tp8"]
    assert bad.returncode != 0 and "structure.tile.tp" in bad.stdout + bad.stderr
    assert runs["validate-tp8-ep8"].returncode == 0, runs["validate-tp8-ep8"].stdout[-3000:]
