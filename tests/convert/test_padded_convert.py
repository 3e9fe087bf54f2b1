"""`--tp N [--ep M]` on the converters, through the real CLI (subprocesses) on small real checkpoints
(tests/helpers/ckpt_factory.py): flag checks, refusal of an impossible split before any work, the
padded per-rank bytes against the independent engine-equivalent reference (padded_ref.py), the
plan's padded sizes (--dry-run), the recorded layout, and --resume refusing another --tp.
Substitutions: none (real files, real CLI)."""

from __future__ import annotations

import json
import signal

import pytest

from dsv4_convert.core.targets.target import MarlinTarget
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import run_cli, tree_hashes
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


@pytest.mark.parametrize("args, text", [(("--ep", 2), "--ep needs --tp"),
                                        (("--tp", 2, "--ep", 4), "--ep 4 must divide --tp 2")])
def test_bad_tp_ep_pairs_are_usage_errors(mx128, tmp_path, args, text):
    proc = run_cli("mxfp4-to-marlin", mx128.root, tmp_path / "out", *args, check=False)
    assert proc.returncode == 2 and text in proc.stderr and "usage.flags" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_impossible_split_is_refused_before_any_work_with_the_splits_that_work(nv96, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", nv96.root, out, "--target", "sglang", "--tp", 1, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "convert.layout_impossible" in proc.stderr and "sglang does not pad" in proc.stderr
    assert "padded (--tp/--ep): none" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()
    # a group straddling two ranks: I=96 over MoE TP 8 is 12 rows, no engine pads that
    proc = run_cli("nvfp4-to-marlin", nv96.root, out, "--target", "vllm", "--tp", 8, check=False)
    assert proc.returncode == 4 and "convert.layout_impossible" in proc.stderr
    assert "padded (--tp/--ep): TP 1 / EP 1" in proc.stderr and "TP 2 / EP 2" in proc.stderr


def test_without_tp_a_shape_that_needs_padding_still_names_tp(nv96, tmp_path):
    proc = run_cli("nvfp4-to-marlin", nv96.root, tmp_path / "out", "--target", "vllm", check=False)
    assert proc.returncode == 4 and "convert.needs_padding" in proc.stderr and "--tp N" in proc.stderr


def test_nvfp4_vllm_tp1_padded_bytes_match_the_engine_reference(nv96, tmp_path):
    out = tmp_path / "out"
    plan = json.loads(run_cli("nvfp4-to-marlin", nv96.root, "--dry-run", "--json", "--target", "vllm",
                              "--tp", 1).stdout)
    run_cli("nvfp4-to-marlin", nv96.root, out, "--target", "vllm", "--tp", 1, "-q")
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


@pytest.mark.parametrize("target, tp, ep", [("vllm", 2, 1), ("sglang", 4, 2)])
def test_mxfp4_moe_tp2_padded_per_rank_bytes(mx128, tmp_path, target, tp, ep):
    out = tmp_path / "out"
    run_cli("mxfp4-to-marlin", mx128.root, out, "--target", target, "--tp", tp, "--ep", ep, "-q")
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


def test_tp_that_needs_no_padding_writes_the_layout_agnostic_bytes(mx128, tmp_path):
    plain, fixed = tmp_path / "plain", tmp_path / "fixed"
    run_cli("mxfp4-to-marlin", mx128.root, plain, "--target", "vllm", "-q")
    run_cli("mxfp4-to-marlin", mx128.root, fixed, "--target", "vllm", "--tp", 1, "-q")
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


def test_nvfp4_vllm_tp2_padded_per_rank_bytes(nv96, tmp_path):
    """I=96 at TP 2: I_shard 48 -> 64 per rank; the whole stack's rescale factor (recorded)."""
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", nv96.root, out, "--target", "vllm", "--tp", 2, "-q")
    got = load_out(out)
    for r in range(2):
        ref = rank_reference("nvfp4", MarlinTarget("vllm"), _experts(nv96, "layers.0.ffn.experts"), r=r, m=2,
                             i_pad=64, h_pad=128)
        for e in range(2):
            keys = tuple(f"layers.0.ffn.experts.{e}.{w}" for w in ("w1", "w3", "w2"))
            assert_rank_blocks(got, keys, ref, e, r=r, fmt="nvfp4", i_pad=64)
    assert tuple(got["layers.0.ffn.experts.0.w2.weight"].shape) == (2 * 64 // 16, 2 * 128)
