"""Real shapes padded end to end through the real CLI command lines, each rank's bytes against the
independent reference of padded_ref.py (engine_stacks.py on that rank's source slice):
- a gpt-oss-20b-shaped layer (H = I = 2880, `mxfp4-gptoss`, stacked and interleaved gate/up, biases):
  vLLM at TP 1 (I 2880 -> 2944, H -> 3072) and TP 2 (I_shard 1440 -> 1536), SGLang at TP 2;
- DeepSeek-V4 shapes at TP 8: H=4096, I=256 MXFP4 (I_shard 32 -> 128) and I=1536 MXFP4 (192 -> 256).
Where the test is about bytes the data is 2 experts of real size (small random matrices quantized by
ckpt_factory); where it is about shapes and the plan, the real 32 experts come from headers only
(sparse files, padded_ref.write_header_only). Substitution: the command lines run in one CLI process
(run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), not one
process each: a process start costs more than the plans."""

from __future__ import annotations

import json

import pytest

from dsv4_convert.core.targets.target import MarlinTarget
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import run_cli_batch, succeeded
from tests.helpers.compare import assert_bytes_equal
from tests.helpers.padded_ref import assert_rank_blocks, gptoss_headers, load_out, rank_reference

H = INTER = 2880
GPTOSS = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("gptoss") / "src", "mxfp4-gptoss", layers=1, experts=2, hidden=H,
                           inter=INTER, shards=1)


GPTOSS_SPLITS = [("vllm", 1, 2944), ("vllm", 2, 1536), ("sglang", 2, 1536)]
DSV4_TP8 = [(256, "vllm", 128), (1536, "sglang", 256)]
PLANS = [("vllm", 1, 1, 2944), ("vllm", 2, 1, 3072), ("sglang", 2, 2, 2944)]


@pytest.fixture(scope="module")
def runs(gptoss, tmp_path_factory) -> dict:
    """(test, case) -> the CLI's answer, ("out" | "src" | "built", test, case) -> what the test reads: every test's
    conversions and plans in one CLI process."""
    work = tmp_path_factory.mktemp("padded-real")
    runs, steps = {}, {}
    for case in GPTOSS_SPLITS:
        target, tp, _ = case
        out = runs["out", "gptoss", case] = work / f"gptoss-{target}-{tp}" / "out"
        steps["gptoss", case] = ["mxfp4-to-marlin", gptoss.root, out, "--target", target, "--tp", tp, "-q"]
    for case in DSV4_TP8:
        inter, target, _ = case
        d = work / f"dsv4-{inter}"
        built = runs["built", "dsv4", case] = make_checkpoint(d / "src", "mxfp4-dsv4", layers=1, experts=2, hidden=4096,
                                                              inter=inter, shards=1)
        out = runs["out", "dsv4", case] = d / "out"
        steps["dsv4", case] = ["mxfp4-to-marlin", built.root, out, "--target", target, "--tp", 8, "-q"]
    for case in PLANS:
        target, tp, ep, _ = case
        src, runs["tensors", "plan", case] = gptoss_headers(work / f"headers-{target}-{tp}-{ep}" / "src")
        steps["plan", case] = ["mxfp4-to-marlin", src, "--dry-run", "--json", "--target", target, "--tp", tp, "--ep", ep]
    runs.update(zip(steps, run_cli_batch(list(steps.values()), work)))
    for key in steps:
        succeeded(runs[key])
    return runs


def _experts(built, prefix, names, n=2):
    return [{role: built.expected[f"{prefix}.{e}.{nm}"] for role, nm in zip(("gate", "up", "down"), names)}
            for e in range(n)]


def _check_ranks(built, out, prefix, names, *, fmt, target, m, i_pad, h_pad, n=2):
    got = load_out(out)
    experts = _experts(built, prefix, names, n)
    for r in range(m):
        ref = rank_reference(fmt, MarlinTarget(target), experts, r=r, m=m, i_pad=i_pad, h_pad=h_pad)
        for e in range(n):
            assert_rank_blocks(got, tuple(f"{prefix}.{e}.{nm}" for nm in names), ref, e, r=r, fmt=fmt, i_pad=i_pad)
    return got


@pytest.mark.parametrize("target, tp, i_pad", GPTOSS_SPLITS)
def test_gptoss_layer_padded_per_rank(gptoss, runs, target, tp, i_pad):
    out = runs["out", "gptoss", (target, tp, i_pad)]
    got = _check_ranks(gptoss, out, "model.layers.0.mlp.experts", GPTOSS, fmt="mxfp4", target=target, m=tp,
                       i_pad=i_pad, h_pad=3072)
    for bias in ("gate_up_proj_bias", "down_proj_bias"):  # byte copies: the engine's loader pads them
        name = f"model.layers.0.mlp.experts.{bias}"
        assert_bytes_equal(got[name], gptoss.tensors[name], name)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["layouts"] == [{"tp": tp, "ep": 1}]
    assert qc["tp_layout"]["containers"]["model.layers.0.mlp.experts"] == {
        "hidden": H, "intermediate": INTER, "i_shard": INTER // tp, "i_pad": i_pad, "h_pad": 3072, "status": "pad"}


@pytest.mark.parametrize("inter, target, i_pad", DSV4_TP8)
def test_dsv4_shapes_at_tp8_padded_per_rank(runs, inter, target, i_pad):
    built, out = runs["built", "dsv4", (inter, target, i_pad)], runs["out", "dsv4", (inter, target, i_pad)]
    _check_ranks(built, out, "layers.0.ffn.experts", ("w1", "w3", "w2"), fmt="mxfp4", target=target, m=8,
                 i_pad=i_pad, h_pad=4096)


@pytest.mark.parametrize("target, tp, ep, m_i_pad", PLANS)
def test_gptoss_20b_layer_plan_counts_the_padding(runs, target, tp, ep, m_i_pad):
    tensors = runs["tensors", "plan", (target, tp, ep, m_i_pad)]
    plan = json.loads(runs["plan", (target, tp, ep, m_i_pad)].stdout)
    size = {"U8": 1, "BF16": 2}
    other = sum(size[d] * _prod(s) for n, (d, s) in tensors.items() if "_blocks" not in n and "_scales" not in n)
    per_projection = 3072 * m_i_pad // 2 + 3072 * m_i_pad // 32  # I32 weight [K/16, 2N] + E8M0 scale [K/32, N]
    assert plan["bytes_out"] == other + 32 * 3 * per_projection
    assert plan["tp_layout"]["tp"] == tp and plan["layouts"] == [{"tp": tp, "ep": ep}]
    assert plan["tensors_out"] == len(tensors) - 4 + 32 * 3 * 2


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n
