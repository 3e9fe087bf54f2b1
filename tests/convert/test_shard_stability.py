"""Shard stability (docs/FORMAT.md): when every tensor-parallel rank keeps whole Marlin tiles, a
rank's slice of a converted tensor equals the packing of that rank's slice of the source, so a TP
loader can slice the converted checkpoint directly. Checked on real converter output."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Quant, Role
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from tests.helpers.cli import run_cli
from tests.helpers.compare import assert_bytes_equal


def _converted(out, name):
    index = json.loads((out / "model.safetensors.index.json").read_text())
    with safe_open(out / index["weight_map"][name], "pt") as f:
        return f.get_tensor(name)


@pytest.mark.parametrize("fmt,command", [("nvfp4-modelopt-dsv4", "nvfp4-to-marlin"), ("mxfp4-dsv4", "mxfp4-to-marlin")])
def test_tp_slices_of_converted_tensors_equal_packed_source_slices(tmp_path, synth_source, fmt, command):
    src = synth_source(fmt, layers=1, experts=2, hidden=512, intermediate=256)
    out = tmp_path / "out"
    run_cli(command, src, out, "--target", "sglang", "-q")  # sglang: no stack-wide factor, so slices are local
    target = MarlinTarget("sglang")
    pack = nvfp4_to_marlin if fmt.startswith("nvfp4") else mxfp4_to_marlin
    ckpt = open_checkpoint(src)
    with TensorReader(src) as reader:
        for p in ckpt.projections:
            d = load_projection(reader, p, fmt=ckpt.format)
            q, s = _converted(out, f"{p.key}.weight"), _converted(out, f"{p.key}.weight_scale")
            for tp in (2, 4):
                for r in range(tp):
                    if p.role is Role.DOWN:  # row-parallel: split K
                        kb, kg = d.weight.shape[1] // tp, d.scale.shape[1] // tp
                        q_r, s_r = pack(d.weight[:, r * kb:(r + 1) * kb], d.scale[:, r * kg:(r + 1) * kg], target=target)
                        rows, srows = q.shape[0] // tp, s.shape[0] // tp
                        assert_bytes_equal(q[r * rows:(r + 1) * rows], q_r, f"{p.key} tp{tp} r{r} weight")
                        assert_bytes_equal(s[r * srows:(r + 1) * srows], s_r, f"{p.key} tp{tp} r{r} scale")
                    else:  # column-parallel: split N
                        n = d.weight.shape[0] // tp
                        q_r, s_r = pack(d.weight[r * n:(r + 1) * n], d.scale[r * n:(r + 1) * n], target=target)
                        assert_bytes_equal(q[:, 2 * n * r:2 * n * (r + 1)], q_r, f"{p.key} tp{tp} r{r} weight")
                        assert_bytes_equal(s[:, n * r:n * (r + 1)], s_r, f"{p.key} tp{tp} r{r} scale")
    assert any(p.quant is Quant.NVFP4 for p in ckpt.projections) == fmt.startswith("nvfp4")


def test_w13_stack_equals_concatenated_gate_and_up(tmp_path, synth_source):
    """What the engines build (pack the stacked [gate; up]) equals our per-projection tensors side by side."""
    src = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=2, hidden=512, intermediate=256)
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, "--target", "sglang", "-q")
    ckpt = open_checkpoint(src)
    with TensorReader(src) as reader:
        by_key = {p.key: load_projection(reader, p, fmt=ckpt.format) for p in ckpt.projections}
    for e in range(2):
        gate, up = by_key[f"layers.0.ffn.experts.{e}.w1"], by_key[f"layers.0.ffn.experts.{e}.w3"]
        q, s = nvfp4_to_marlin(torch.cat([gate.weight, up.weight]), torch.cat([gate.scale, up.scale]),
                               target=MarlinTarget("sglang"))
        for part, stacked in (("weight", q), ("weight_scale", s)):
            ours = torch.cat([_converted(out, f"layers.0.ffn.experts.{e}.{w}.{part}") for w in ("w1", "w3")], dim=1)
            assert_bytes_equal(ours, stacked, f"expert {e} w13 {part}")
