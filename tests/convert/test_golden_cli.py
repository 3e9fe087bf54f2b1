"""The golden padding case through the real CLI: a tiny real ModelOpt NVFP4 checkpoint whose experts
carry the `src.*` tensors of tests/golden/nvfp4_moe_vllm_bfloat16_pad_s0.safetensors (made by vLLM
0.33.0's own preparation code; I=96, which vLLM pads to 128), converted with `--target vllm --tp 1`;
every output tensor equals the golden `marlin.*` expert slice byte for byte. Golden stacks are
[E, ...] (w13 = gate rows then up rows); ours are per expert (w1 gate, w3 up), so the gate is the
first half of w13's N columns. Substitutions: none (the golden file is the engine's output)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from tests.helpers.ckpt_factory import make_checkpoint, write_shards
from tests.helpers.cli import run_cli
from tests.helpers.compare import assert_bytes_equal
from tests.helpers.padded_ref import load_out

GOLDEN = Path(__file__).parents[1] / "golden" / "nvfp4_moe_vllm_bfloat16_pad_s0.safetensors"


def _golden():
    with safe_open(str(GOLDEN), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118


def test_golden_nvfp4_moe_pad_case_through_the_cli(tmp_path):
    g, meta = _golden()
    h, i, n = int(meta["H"]), int(meta["I"]), int(meta["E"])
    assert (h, i, meta["impl"], meta["act_dtype"]) == (256, 96, "vllm", "bfloat16")
    built = make_checkpoint(tmp_path / "src", "nvfp4-modelopt-dsv4", layers=1, experts=n, hidden=h, inter=i, shards=1)
    t = built.tensors
    for e in range(n):
        p = f"layers.0.ffn.experts.{e}"
        for w, rows, gi in (("w1", slice(0, i), 0), ("w3", slice(i, 2 * i), 1)):
            t[f"{p}.{w}.weight"] = g["src.w13_weight"][e, rows].clone()
            t[f"{p}.{w}.weight_scale"] = g["src.w13_weight_scale"][e, rows].clone()
            t[f"{p}.{w}.weight_scale_2"] = g["src.w13_weight_scale_2"][e, gi].clone().reshape(t[f"{p}.{w}.weight_scale_2"].shape)
        t[f"{p}.w2.weight"] = g["src.w2_weight"][e].clone()
        t[f"{p}.w2.weight_scale"] = g["src.w2_weight_scale"][e].clone()
        t[f"{p}.w2.weight_scale_2"] = g["src.w2_weight_scale_2"][e].clone().reshape(t[f"{p}.w2.weight_scale_2"].shape)
    write_shards(built.root, t, 1)
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", built.root, out, "--target", "vllm", "--act-dtype", "bfloat16", "--tp", 1, "-q")
    got = load_out(out)
    ip = 128  # vLLM's padded I (formats.tiles.padded_moe_intermediate(96, 256))
    for e in range(n):
        p = f"layers.0.ffn.experts.{e}"
        for w, half in (("w1", 0), ("w3", 1)):
            assert_bytes_equal(got[f"{p}.{w}.weight"], g["marlin.w13_weight"][e][:, half * 2 * ip:(half + 1) * 2 * ip],
                               f"{p}.{w}.weight")
            assert_bytes_equal(got[f"{p}.{w}.weight_scale"], g["marlin.w13_weight_scale"][e][:, half * ip:(half + 1) * ip],
                               f"{p}.{w}.weight_scale")
        assert_bytes_equal(got[f"{p}.w1.weight_global_scale"], g["marlin.w13_weight_scale_2"][e], f"{p}.w1 global")
        assert_bytes_equal(got[f"{p}.w2.weight"], g["marlin.w2_weight"][e], f"{p}.w2.weight")
        assert_bytes_equal(got[f"{p}.w2.weight_scale"], g["marlin.w2_weight_scale"][e], f"{p}.w2.weight_scale")
        assert_bytes_equal(got[f"{p}.w2.weight_global_scale"], g["marlin.w2_weight_scale_2"][e], f"{p}.w2 global")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["tp_layout"]["containers"]["layers.0.ffn.experts"]["i_pad"] == ip
