"""formats/e4m3.py: E4M3 views and Marlin's S0E5M3 bytes, over all 256 E4M3 bytes."""

import pytest
import torch

from dsv4_convert.formats.e4m3 import as_e4m3, e4m3_to_float, half_to_s0e5m3, s0e5m3_to_half
from tests.helpers.compare import assert_bytes_equal

ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_views_never_convert():
    for dtype in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        assert_bytes_equal(as_e4m3(ALL_BYTES.view(dtype)).view(torch.uint8), ALL_BYTES)


def test_decode_matches_torch_for_every_byte():
    assert_bytes_equal(e4m3_to_float(ALL_BYTES), ALL_BYTES.view(torch.float8_e4m3fn).float())


@pytest.mark.parametrize(
    ("e4m3_byte", "s0e5m3_byte"),
    [
        (0x38, 0xB0),  # 1.0 * 128 = 2**7: fp16 exponent 22 -> 22*8 + 0
        (0x7E, 0xF6),  # 448 * 128 = 57344 = 2**15 * 1.75: exponent 30, mantissa 0b110 -> 246
        (0x01, 0x68),  # smallest subnormal 2**-9 * 128 = 0.25: exponent 13 -> 104
        (0x00, 0x00),  # +0
        (0x80, 0x00),  # -0 loses its sign
        (0xB8, 0xB0),  # -1.0: the sign bit is dropped
    ],
)
def test_s0e5m3_hand_cases(e4m3_byte, s0e5m3_byte):
    v = torch.tensor([e4m3_byte], dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float16) * 128
    assert half_to_s0e5m3(v).item() == s0e5m3_byte


def test_every_non_negative_finite_scale_roundtrips_through_s0e5m3():
    finite = ALL_BYTES[:0x7F]  # 0x00..0x7E: +0 .. 448
    v = finite.view(torch.float8_e4m3fn).to(torch.float16) * 128
    back = (s0e5m3_to_half(half_to_s0e5m3(v)).float() / 128).to(torch.float8_e4m3fn)
    assert_bytes_equal(back.view(torch.uint8), finite)


def test_wrong_dtypes_raise():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        as_e4m3(torch.ones(2))
    with pytest.raises(ValueError, match="float16"):
        half_to_s0e5m3(torch.ones(2))
