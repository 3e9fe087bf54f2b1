import math

import pytest
import torch

from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks import globals as g
from dsv4_convert.validate.checks import numerics as nm
from dsv4_convert.validate.inputs import ExpertTensors, Options
from tests.helpers.checks import mxfp4_tensors, nvfp4_tensors, refresh, run, set_scale_byte


def _with_global(p, value):
    p.global_scale = torch.tensor(value, dtype=torch.float32)
    return refresh(p)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1e-3])
def test_invalid_global(value):
    (f,) = run(g.global_invalid, _with_global(nvfp4_tensors(), value))
    assert f.tensor.endswith(".weight_scale_2") and "finite value > 0" in f.message


@pytest.mark.parametrize("engine,act,value,sev", [
    ("vllm", "bfloat16", 600.0, Severity.ERROR), ("sglang", "bfloat16", 600.0, Severity.ERROR),
    ("sglang", "float16", 600.0, Severity.ERROR), ("sglang", "float16", 1e-5, Severity.WARNING),
    ("sglang", "float16", 1e-9, Severity.ERROR), ("vllm", "float16", 600.0, None), ("vllm", "bfloat16", 1e-3, None)])
def test_global_range_per_target(engine, act, value, sev):
    out = run(g.global_range, _with_global(nvfp4_tensors(), value), Options(target=MarlinTarget(engine=engine, act_dtype=act)))
    if sev is None:
        assert out == []
    else:
        (f,) = out
        assert (f.severity or g.global_range.severity) is sev


def test_vllm_range_scales_with_rescale_factor():
    p = _with_global(nvfp4_tensors(), 600.0)
    p.sf = 2.0
    assert run(g.global_range, p, Options(target=MarlinTarget(engine="vllm"))) == []


def _expert(gate_g, up_g, **kw):
    gate = _with_global(nvfp4_tensors(role=Role.GATE, **kw), gate_g)
    up = _with_global(nvfp4_tensors(role=Role.UP, seed=1, **kw), up_g)
    down = nvfp4_tensors(role=Role.DOWN, n=256, k=128, seed=2, **kw)
    return ExpertTensors("0", 0, {Role.GATE: gate, Role.UP: up, Role.DOWN: down})


def test_gate_up_mismatch():
    assert run(g.gate_up_mismatch, _expert(0.01, 0.01)) == []
    (f,) = run(g.gate_up_mismatch, _expert(0.01, 0.008))
    assert f.tensor == "layers.0.ffn.experts.0.w3.weight_scale_2" and "1.25x" in f.message


def test_dequant_nonfinite_from_nan_scale_and_global():
    p = set_scale_byte(nvfp4_tensors(), (9, 3), 0x7F)
    (f,) = run(nm.dequant_nonfinite, p)
    assert f.first == (9, 3) and f.count == 1
    (f,) = run(nm.dequant_nonfinite, _with_global(nvfp4_tensors(), float("nan")))
    assert f.count == 128 * 16
    (f,) = run(nm.dequant_nonfinite, set_scale_byte(mxfp4_tensors(), (0, 0), 0xFF))
    assert f.first == (0, 0)
    assert run(nm.dequant_nonfinite, nvfp4_tensors()) == []


def test_masks_match_real_dequantization():
    from dsv4_convert.validate.emulate import source_dequantize
    cases = [set_scale_byte(nvfp4_tensors(), (1, 2), 0x7F), set_scale_byte(nvfp4_tensors(), (3, 3), 0),
             set_scale_byte(set_scale_byte(mxfp4_tensors(), (0, 0), 254), (1, 1), 253),
             set_scale_byte(mxfp4_tensors(), (2, 2), 0xFF), _with_global(nvfp4_tensors(), 1e36)]
    for p in cases:
        full = source_dequantize(p).reshape(p.proj.n, -1, p.proj.group_size)
        assert (~torch.isfinite(full).all(-1)).numpy().tolist() == p.nonfinite_blocks.tolist()
        assert (full == 0).all(-1).numpy().tolist() == p.zero_blocks.tolist()


def test_block_absmax_matches_real_dequantization():
    from dsv4_convert.validate.emulate import source_dequantize
    for p in (nvfp4_tensors(), mxfp4_tensors()):
        full = source_dequantize(p).abs().reshape(p.proj.n, -1, p.proj.group_size).amax(-1)
        assert torch.equal(full, p.block_absmax)


def test_all_zero_expert():
    e = _expert(0.01, 0.01)
    assert run(nm.all_zero_expert, e) == []
    e.projections[Role.DOWN].weight = torch.zeros_like(e.projections[Role.DOWN].weight)
    refresh(e.projections[Role.DOWN])
    (f,) = run(nm.all_zero_expert, e)
    assert "down" in f.message and f.tensor == "layers.0.ffn.experts.0" and not math.isnan(f.count)
