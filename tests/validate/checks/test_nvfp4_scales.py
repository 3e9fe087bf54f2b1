import pytest
import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks import nvfp4_scales as c
from dsv4_convert.validate.inputs import Options
from tests.helpers.checks import nvfp4_tensors, refresh, run, set_scale_byte


@pytest.mark.parametrize("chk", [c.nan_scales, c.negative_scales, c.subnormal_scales, c.zero_scales])
def test_clean_projection_passes(chk):
    assert run(chk, nvfp4_tensors()) == []


def test_nan_scale_counted_with_first_coordinates():
    p = set_scale_byte(set_scale_byte(nvfp4_tensors(), (3, 5), 0x7F), (7, 1), 0xFF)
    (f,) = run(c.nan_scales, p)
    assert (f.count, f.first, f.tensor) == (2, (3, 5), "layers.0.ffn.experts.0.w1.weight_scale")
    assert "2 of 2048 block scales are NaN" in f.message and "[3, 5]" in f.message


@pytest.mark.parametrize("engine,effect", [("vllm", "vLLM zeroes"), ("sglang", "|s|")])
def test_negative_scale_names_what_the_engine_does(engine, effect):
    p = nvfp4_tensors()
    p = set_scale_byte(p, (0, 0), int(p.scale_bytes[0, 0]) | 0x80)
    (f,) = run(c.negative_scales, p, Options(target=MarlinTarget(engine=engine)))
    assert f.first == (0, 0) and effect in f.message


@pytest.mark.parametrize("engine,act,severity", [
    ("vllm", "bfloat16", Severity.ERROR), ("vllm", "float16", Severity.ERROR),
    ("sglang", "bfloat16", Severity.ERROR), ("sglang", "float16", Severity.INFO)])
def test_subnormal_verdict_depends_on_target(engine, act, severity):
    p = set_scale_byte(nvfp4_tensors(), (2, 3), 0x03)
    (f,) = run(c.subnormal_scales, p, Options(target=MarlinTarget(engine=engine, act_dtype=act)))
    assert (f.severity or c.subnormal_scales.severity) is severity and f.first == (2, 3)


def test_subnormal_lifted_by_the_real_vllm_rescale_factor_is_not_an_error():
    p = set_scale_byte(nvfp4_tensors(), (2, 3), 0x04)  # 2**-7; sf = 4 lifts it to 2**-5
    p.sf = 4.0
    (f,) = run(c.subnormal_scales, p, Options(target=MarlinTarget(engine="vllm")))
    assert f.severity is Severity.INFO


def test_zero_scale_only_counts_blocks_with_codes():
    p = nvfp4_tensors()
    p = set_scale_byte(p, (1, 1), 0x00)
    (f,) = run(c.zero_scales, p)
    assert f.first == (1, 1) and f.count == 1
    w = p.weight.clone()
    w[1, 8:16] = 0  # block 1 of row 1 (k 16..31) now has no codes
    p.weight = w
    refresh(p)
    assert run(c.zero_scales, p) == []


def test_scale_values_never_convert_bytes():
    p = nvfp4_tensors()
    assert torch.equal(p.scale_bytes, p.scale.view(torch.uint8))
