"""formats/e8m0.py: all 256 bytes, exponent round trip, bad input."""

import pytest
import torch

from dsv4_convert.formats.e8m0 import as_e8m0_bytes, e8m0_to_float, exponent_to_e8m0
from tests.helpers.compare import assert_bytes_equal

ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_every_byte_decodes_to_a_power_of_two_and_0xff_to_nan():
    values = e8m0_to_float(ALL_BYTES)
    for e in range(255):
        assert values[e].item() == 2.0 ** (e - 127), e
    assert torch.isnan(values[255])


@pytest.mark.parametrize(("byte", "value"), [(127, 1.0), (128, 2.0), (126, 0.5), (0, 2.0**-127), (254, 2.0**127)])
def test_hand_cases(byte, value):
    assert e8m0_to_float(torch.tensor([byte], dtype=torch.uint8)).item() == value


def test_agrees_with_torch_float8_e8m0fnu():
    as_torch = ALL_BYTES.view(torch.float8_e8m0fnu).float()
    ours = e8m0_to_float(ALL_BYTES.view(torch.float8_e8m0fnu))
    assert_bytes_equal(ours[:255], as_torch[:255])
    assert torch.isnan(ours[255]) and torch.isnan(as_torch[255])  # NaN payloads may differ


def test_views_never_convert():
    for dtype in (torch.float8_e8m0fnu, torch.int8, torch.uint8):
        assert_bytes_equal(as_e8m0_bytes(ALL_BYTES.view(dtype)), ALL_BYTES)


def test_exponent_roundtrip_over_the_whole_range():
    exponents = torch.arange(-127, 128)
    b = exponent_to_e8m0(exponents)
    assert_bytes_equal(b, torch.arange(0, 255, dtype=torch.int32).to(torch.uint8))
    assert torch.equal(torch.log2(e8m0_to_float(b)).to(torch.int64), exponents)


@pytest.mark.parametrize("exponent", [-128, 128, 1000])
def test_exponent_out_of_range_raises(exponent):
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):
        exponent_to_e8m0(torch.tensor([exponent]))


def test_wrong_dtype_raises():
    with pytest.raises(ValueError, match="float8_e8m0fnu or uint8"):
        as_e8m0_bytes(torch.ones(4))
