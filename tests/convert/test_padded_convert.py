"""`--tp N [--ep M]` on the converters, through the real CLI (subprocesses) on small real checkpoints
(tests/helpers/ckpt_factory.py): flag checks, refusal of an impossible split before any work, the
padded per-rank bytes against the independent engine-equivalent reference (padded_ref.py), the
plan's padded sizes (--dry-run), the recorded layout, and --resume refusing another --tp.
Substitutions: real files, the real CLI; the command lines but the resume test's run in one CLI process, in
order (run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), not one
process each: a process start costs more than these commands. The resume test (a kill) keeps its processes."""

from __future__ import annotations

import json
import signal

import pytest

from dsv4_convert.core.targets.target import MarlinTarget
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import run_cli, run_cli_batch, succeeded, tree_hashes
from tests.helpers.padded_ref import assert_rank_blocks, load_out, rank_reference


@pytest.fixture(scope="module")
def nv96(tmp_path_factory):
    """NVFP4 ModelOpt, H=128, I=96: vLLM pads I to 128 (H % 128 == 0 -> multiple of 64); SGLang cannot."""
    return make_checkpoint(tmp_path_factory.mktemp("nv96") / "src", "nvfp4-modelopt-dsv4", layers=1, experts=2,
                           hidden=128, inter=96, shards=1)


@pytest.fixture(scope="module")
def mx128(tmp_path_factory):
    """MXFP4 DSV4, H=256, I=128: unpadded at TP 1; at MoE TP 2 I_shard 64 -> 128 (both engines)."""
    return make_checkpoint(tmp_path_factory.mktemp("mx128") / "src", "mxfp4-dsv4", layers=1, experts=2,
                           hidden=256, inter=128, shards=2)


def _experts(built, prefix: str, names=("w1", "w3", "w2"), n: int = 2) -> list[dict]:
    return [{role: built.expected[f"{prefix}.{e}.{nm}"] for role, nm in zip(("gate", "up", "down"), names)}
            for e in range(n)]


def _qc(out):
    return json.loads((out / "config.json").read_text())["quantization_config"]


BAD_PAIRS = [(("--ep", 2), "--ep needs --tp"), (("--tp", 2, "--ep", 4), "--ep 4 must divide --tp 2")]
MX_SPLITS = [("vllm", 2, 1), ("sglang", 4, 2)]


@pytest.fixture(scope="module")
def runs(nv96, mx128, tmp_path_factory) -> dict:
    """(test, case) -> the CLI's answer, ("out", test, case) -> its OUT: every test's command lines but the resume
    test's, in one CLI process."""
    work = tmp_path_factory.mktemp("padded")
    nv, mx = nv96.root, mx128.root
    outs = {}

    def out(test, case=None):
        return outs.setdefault(("out", test, case), work / f"{test}-{len(outs)}" / "out")
    steps = {**{("bad-pair", i): ["mxfp4-to-marlin", mx, out("bad-pair", i), *args] for i, (args, _) in enumerate(BAD_PAIRS)},
             ("impossible", "sglang"): ["nvfp4-to-marlin", nv, out("impossible"), "--target", "sglang", "--tp", 1],
             ("impossible", "tp8"): ["nvfp4-to-marlin", nv, out("impossible"), "--target", "vllm", "--tp", 8],
             ("names-tp", None): ["nvfp4-to-marlin", nv, out("names-tp"), "--target", "vllm"],
             ("nv-tp1", "plan"): ["nvfp4-to-marlin", nv, "--dry-run", "--json", "--target", "vllm", "--tp", 1],
             ("nv-tp1", "convert"): ["nvfp4-to-marlin", nv, out("nv-tp1"), "--target", "vllm", "--tp", 1, "-q"],
             **{("mx-tp2", split): ["mxfp4-to-marlin", mx, out("mx-tp2", split), "--target", split[0], "--tp", split[1],
                                    "--ep", split[2], "-q"] for split in MX_SPLITS},
             ("agnostic", "plain"): ["mxfp4-to-marlin", mx, out("agnostic", "plain"), "--target", "vllm", "-q"],
             ("agnostic", "fixed"): ["mxfp4-to-marlin", mx, out("agnostic", "fixed"), "--target", "vllm", "--tp", 1, "-q"],
             ("nv-tp2", None): ["nvfp4-to-marlin", nv, out("nv-tp2"), "--target", "vllm", "--tp", 2, "-q"]}
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), work))), **outs}



@pytest.mark.parametrize("i", range(len(BAD_PAIRS)))
def test_bad_tp_ep_pairs_are_usage_errors(runs, i):
    proc, text = runs["bad-pair", i], BAD_PAIRS[i][1]
    assert proc.returncode == 2 and text in proc.stderr and "usage.flags" in proc.stderr, proc.stderr
    assert not runs["out", "bad-pair", i].exists()


def test_impossible_split_is_refused_before_any_work_with_the_splits_that_work(runs):
    out = runs["out", "impossible", None]
    proc = runs["impossible", "sglang"]
    assert proc.returncode == 4, proc.stderr
    assert "convert.layout_impossible" in proc.stderr and "sglang does not pad" in proc.stderr
    assert "padded (--tp/--ep): none" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()
    # a group straddling two ranks: I=96 over MoE TP 8 is 12 rows, no engine pads that
    proc = runs["impossible", "tp8"]
    assert proc.returncode == 4 and "convert.layout_impossible" in proc.stderr
    assert "padded (--tp/--ep): TP 1 / EP 1" in proc.stderr and "TP 2 / EP 2" in proc.stderr


def test_without_tp_a_shape_that_needs_padding_still_names_tp(runs):
    proc = runs["names-tp", None]
    assert proc.returncode == 4 and "convert.needs_padding" in proc.stderr and "--tp N" in proc.stderr


def test_nvfp4_vllm_tp1_padded_bytes_match_the_engine_reference(nv96, runs):
    out = runs["out", "nv-tp1", None]
    plan = json.loads(succeeded(runs["nv-tp1", "plan"]).stdout)
    succeeded(runs["nv-tp1", "convert"])
    got = load_out(out)
    ref = rank_reference("nvfp4", MarlinTarget("vllm"), _experts(nv96, "layers.0.ffn.experts"), r=0, m=1,
                         i_pad=128, h_pad=128)
    for e in range(2):
        keys = tuple(f"layers.0.ffn.experts.{e}.{w}" for w in ("w1", "w3", "w2"))
        assert_rank_blocks(got, keys, ref, e, r=0, fmt="nvfp4", i_pad=128)
    assert tuple(got["layers.0.ffn.experts.0.w1.weight"].shape) == (128 // 16, 2 * 128)
    assert tuple(got["layers.0.ffn.experts.0.w2.weight"].shape) == (128 // 16, 2 * 128)
    # the plan (--dry-run) counts the padded bytes: it is what was written
    written = sum(t.numel() * t.element_size() for t in got.values())
    assert plan["bytes_out"] == written
    assert plan["tp_layout"]["containers"]["layers.0.ffn.experts"]["i_pad"] == 128
    qc = _qc(out)
    assert qc["layouts"] == [{"tp": 1, "ep": 1}]
    assert qc["tp_layout"] == {"tp": 1, "ep": 1, "containers": {"layers.0.ffn.experts": {
        "hidden": 128, "intermediate": 96, "i_shard": 96, "i_pad": 128, "h_pad": 128, "status": "pad"}}}
    serving = (out / "SERVING.md").read_text()
    assert "TP 1 / EP 1 only" in serving and "I_shard 96 -> 128" in serving


@pytest.mark.parametrize("target, tp, ep", MX_SPLITS)
def test_mxfp4_moe_tp2_padded_per_rank_bytes(mx128, runs, target, tp, ep):
    out = runs["out", "mx-tp2", (target, tp, ep)]
    succeeded(runs["mx-tp2", (target, tp, ep)])
    got = load_out(out)
    experts = _experts(mx128, "layers.0.ffn.experts")
    for r in range(2):
        ref = rank_reference("mxfp4", MarlinTarget(target), experts, r=r, m=2, i_pad=128, h_pad=256)
        for e in range(2):
            keys = tuple(f"layers.0.ffn.experts.{e}.{w}" for w in ("w1", "w3", "w2"))
            assert_rank_blocks(got, keys, ref, e, r=r, fmt="mxfp4", i_pad=128)
    assert tuple(got["layers.0.ffn.experts.0.w1.weight"].shape) == (256 // 16, 2 * 2 * 128)
    assert tuple(got["layers.0.ffn.experts.0.w2.weight"].shape) == (2 * 128 // 16, 2 * 256)
    qc = _qc(out)
    assert qc["layouts"] == [{"tp": tp, "ep": ep}] and qc["tp_layout"]["tp"] == tp and qc["tp_layout"]["ep"] == ep
    assert f"--tp {tp}" in (out / "SERVING.md").read_text().replace("--tensor-parallel-size", "--tp")


def test_tp_that_needs_no_padding_writes_the_layout_agnostic_bytes(runs):
    plain, fixed = runs["out", "agnostic", "plain"], runs["out", "agnostic", "fixed"]
    succeeded(runs["agnostic", "plain"])
    succeeded(runs["agnostic", "fixed"])
    a, b = tree_hashes(plain), tree_hashes(fixed)
    shards = [f for f in a if f.endswith(".safetensors")]
    assert shards and all(a[f] == b[f] for f in shards)
    qp, qf = _qc(plain), _qc(fixed)
    assert "tp_layout" not in qp and qf["layouts"] == qp["layouts"]
    assert qf["tp_layout"]["containers"]["layers.0.ffn.experts"]["status"] == "ok"


def test_resume_with_another_tp_is_refused(mx128, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("mxfp4-to-marlin", mx128.root, out, "--target", "vllm", "--tp", 2, "--workers", 1, "-q",
                   env={"DSV4_CONVERT_KILL_AT": "3"}, check=False)
    assert proc.returncode == -signal.SIGKILL and out.with_name("out.partial").is_dir()
    proc = run_cli("mxfp4-to-marlin", mx128.root, out, "--target", "vllm", "--tp", 4, "--resume", "-q", check=False)
    assert proc.returncode == 5 and "output.resume_mismatch" in proc.stderr, proc.stderr
    run_cli("mxfp4-to-marlin", mx128.root, out, "--target", "vllm", "--tp", 2, "--resume", "-q")
    assert _qc(out)["tp_layout"]["tp"] == 2


def test_nvfp4_vllm_tp2_padded_per_rank_bytes(nv96, runs):
    """I=96 at TP 2: I_shard 48 -> 64 per rank; the whole stack's rescale factor (recorded)."""
    out = runs["out", "nv-tp2", None]
    succeeded(runs["nv-tp2", None])
    got = load_out(out)
    for r in range(2):
        ref = rank_reference("nvfp4", MarlinTarget("vllm"), _experts(nv96, "layers.0.ffn.experts"), r=r, m=2,
                             i_pad=64, h_pad=128)
        for e in range(2):
            keys = tuple(f"layers.0.ffn.experts.{e}.{w}" for w in ("w1", "w3", "w2"))
            assert_rank_blocks(got, keys, ref, e, r=r, fmt="nvfp4", i_pad=64)
    assert tuple(got["layers.0.ffn.experts.0.w2.weight"].shape) == (2 * 64 // 16, 2 * 128)
