"""`dsv4-convert plan --json` through the real CLI, for every source form: stacked gpt-oss experts (the
real 20b layer from headers only), DeepSeek-V4 with MXFP4 MTP experts next to NVFP4 routed ones,
and converted checkpoints (layout-agnostic and padded `--tp/--ep`). Expert and other bytes are
non-negative and sum to the shards' data bytes (file size - header); a split the engine pads carries
the padded expert bytes; a padded conversion is valid only at its recorded split; EP is recommended
where TP would pad. Substitutions: none (real files, real CLI; the gpt-oss file is a real header
over a sparse data hole)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import run_cli
from tests.helpers.padded_ref import gptoss_headers

GIB = 1 << 30


def _data_bytes(root: Path) -> int:
    total = 0
    for f in root.glob("*.safetensors"):
        with open(f, "rb") as h:
            (n,) = struct.unpack("<Q", h.read(8))
        total += f.stat().st_size - 8 - n
    return total


def _plan(root, *args) -> dict:
    proc = run_cli("plan", root, "--json", *args, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _sums(plan, root):
    m = plan["model"]
    assert m["expert_bytes"] >= 0 and m["other_bytes"] >= 0
    assert m["expert_bytes"] + m["other_bytes"] + m["draft_bytes"] == _data_bytes(root)


def test_gptoss_20b_layer_stacked_experts_and_padded_bytes(tmp_path):
    root, tensors = gptoss_headers(tmp_path / "gptoss")
    plan = _plan(root, "--gpus", 2, "--gpu-mem-gib", 96, "--target", "vllm")
    _sums(plan, root)
    expert = sum(_n(s) for n, (d, s) in tensors.items() if n.endswith(("_blocks", "_scales")))
    assert plan["model"]["expert_bytes"] == expert  # 32 x 3 x 2880^2 / 2 + scales, counted once per stack
    by = {(c["tp"], c["ep"]): c for c in plan["candidates"]}
    tp1 = by[(1, 1)]
    assert tp1["tiles"] == "pad" and tp1["padded"] == {"i_shard": 2944, "hidden": 3072}
    assert tp1["padding_factor"] == pytest.approx(2944 * 3072 / 2880**2, abs=1e-4)
    other = plan["model"]["other_bytes"]
    assert tp1["weights_gib"] == pytest.approx((expert * tp1["padding_factor"] + other) / GIB, abs=0.01)
    assert by[(2, 1)]["padded"] == {"i_shard": 1536, "hidden": 3072}
    assert plan["recommended"] == {"tp": 2, "ep": 1}
    assert any("--tp 2" in r and "padded" in r for r in plan["reasoning"])


def _n(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_dsv4_with_mtp_experts_and_its_conversions(tmp_path):
    src = make_checkpoint(tmp_path / "src", "nvfp4-modelopt-dsv4", layers=2, experts=4, hidden=256, inter=128,
                          shards=2, mtp=True).root
    plan = _plan(src, "--gpus", 8, "--target", "vllm")
    _sums(plan, src)
    assert plan["model"]["layers"] == 2 and plan["model"]["quant"] == "nvfp4"
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, "--target", "vllm", "-q")
    conv = _plan(out, "--gpus", 8, "--target", "vllm")
    _sums(conv, out)
    # the layout-agnostic conversion is valid exactly where the tile rule says ok
    assert all(c["valid"] == (c["tiles_ok"] and c["fits"]) for c in conv["candidates"])


def test_padded_conversion_is_valid_only_at_its_split(tmp_path):
    src = make_checkpoint(tmp_path / "src", "mxfp4-dsv4", layers=1, experts=8, hidden=256, inter=128, shards=1).root
    out = tmp_path / "out"
    run_cli("mxfp4-to-marlin", src, out, "--target", "sglang", "--tp", 2, "-q")
    plan = _plan(out, "--gpus", 8, "--target", "sglang")
    _sums(plan, out)
    assert plan["model"]["hidden"] == 256 and plan["model"]["intermediate"] == 128  # the model's, not the padded
    assert plan["model"]["converted_layout"] == [2, 1]
    valid = [(c["tp"], c["ep"]) for c in plan["candidates"] if c["valid"]]
    assert valid == [(2, 1)] and plan["recommended"] == {"tp": 2, "ep": 1}
    other = next(c for c in plan["candidates"] if (c["tp"], c["ep"]) == (4, 4))
    assert "converted for TP 2 / EP 1 only" in other["reasons"][0]
    src_plan = _plan(src, "--gpus", 8, "--target", "sglang")
    by = {(c["tp"], c["ep"]): c for c in src_plan["candidates"]}
    assert by[(8, 1)]["tiles"] in ("pad", "impossible") and by[(8, 8)]["tiles"] == "ok"
    assert src_plan["recommended"] == {"tp": 8, "ep": 8}  # EP where TP would pad
