import pytest

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate.checks import mxfp4_scales as c
from dsv4_convert.validate.inputs import Options
from tests.helpers.checks import mxfp4_tensors, run, set_scale_byte


@pytest.mark.parametrize("chk", [c.nan_scale_bytes, c.overflow_scale_bytes, c.zero_scale_bytes, c.w4a8_scale_range])
def test_clean_projection_passes(chk):
    assert run(chk, mxfp4_tensors(), Options(target=MarlinTarget(engine="vllm", w4a8=True))) == []


def test_nan_byte():
    (f,) = run(c.nan_scale_bytes, set_scale_byte(mxfp4_tensors(), (5, 2), 0xFF))
    assert f.first == (5, 2) and "0xFF" in f.message and "byte 0xff" in f.message


@pytest.mark.parametrize("byte,hit", [(252, False), (253, True), (254, True), (255, False)])
def test_overflow_starts_at_253(byte, hit):
    assert bool(run(c.overflow_scale_bytes, set_scale_byte(mxfp4_tensors(), (0, 0), byte))) is hit


def test_w4a8_range_only_when_w4a8():
    p = set_scale_byte(mxfp4_tensors(), (0, 1), 249)
    assert run(c.w4a8_scale_range, p, Options()) == []
    (f,) = run(c.w4a8_scale_range, p, Options(target=MarlinTarget(engine="vllm", w4a8=True)))
    assert f.first == (0, 1) and "> 248" in f.message


def test_zero_byte_is_a_warning_with_codes():
    (f,) = run(c.zero_scale_bytes, set_scale_byte(mxfp4_tensors(), (4, 4), 0))
    assert f.first == (4, 4) and c.zero_scale_bytes.severity.value == "warning"
