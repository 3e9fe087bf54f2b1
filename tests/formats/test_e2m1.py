"""formats/e2m1.py: nibble order, the 16 codes, round-to-nearest-even, bad input."""

import pytest
import torch

from dsv4_convert.formats.constants import E2M1_VALUES
from dsv4_convert.formats.e2m1 import e2m1_to_float, float_to_e2m1, pack_nibbles, unpack_nibbles
from tests.helpers.compare import assert_bytes_equal

ALL_CODES = torch.arange(16, dtype=torch.uint8)


def test_nibble_order_is_low_first():
    assert pack_nibbles(torch.tensor([0b0001, 0b1010], dtype=torch.uint8)).item() == 0b1010_0001
    assert unpack_nibbles(torch.tensor([0b1010_0001], dtype=torch.uint8)).tolist() == [0b0001, 0b1010]


def test_unpack_reinterprets_int8_without_sign_extension():
    assert unpack_nibbles(torch.tensor([-1, -128], dtype=torch.int8)).tolist() == [15, 15, 0, 8]


@pytest.mark.parametrize("seed", range(4))
def test_pack_unpack_roundtrip(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (seed + 1, 2 * (seed + 3))
    codes = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen)
    assert_bytes_equal(unpack_nibbles(pack_nibbles(codes)), codes)
    packed = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    assert_bytes_equal(pack_nibbles(unpack_nibbles(packed)), packed)


def test_all_codes_decode_to_the_table_including_negative_zero():
    expected = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    assert_bytes_equal(e2m1_to_float(ALL_CODES), expected)
    assert e2m1_to_float(torch.tensor([8], dtype=torch.uint8)).view(torch.int32).item() == -(2**31)  # -0.0


def test_all_codes_roundtrip_through_float():
    assert_bytes_equal(float_to_e2m1(e2m1_to_float(ALL_CODES)), ALL_CODES)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.0, 0b0000), (-0.0, 0b1000), (6.0, 0b0111), (-6.0, 0b1111),
        # ties go to the even code (mantissa bit 0 clear): 0.25 sits between 0 (code 0) and 0.5
        # (code 1) -> 0; 0.75 between 0.5 (1) and 1.0 (2) -> 1.0; and so on up the table
        (0.25, 0b0000), (0.75, 0b0010), (1.25, 0b0010), (1.75, 0b0100),
        (2.5, 0b0100), (3.5, 0b0110), (5.0, 0b0110), (-0.75, 0b1010), (-5.0, 0b1110),
        # just off a tie rounds to the nearer value
        (0.2500001, 0b0001), (0.7499999, 0b0001), (4.9999, 0b0110), (5.0001, 0b0111),
        # beyond the largest magnitude saturates to +-6
        (6.5, 0b0111), (1e30, 0b0111), (float("inf"), 0b0111), (-7.0, 0b1111),
    ],
)
def test_float_to_e2m1_rounds_to_nearest_even(value, code):
    assert float_to_e2m1(torch.tensor([value])).item() == code


def test_float_to_e2m1_accepts_bf16_and_fp16():
    x = torch.tensor([0.75, -1.75, 3.5])
    expected = float_to_e2m1(x)
    for dtype in (torch.bfloat16, torch.float16):
        assert_bytes_equal(float_to_e2m1(x.to(dtype)), expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pack_nibbles(torch.zeros(4, dtype=torch.int32)), "uint8"),
        (lambda: pack_nibbles(torch.zeros(3, dtype=torch.uint8)), "even"),
        (lambda: unpack_nibbles(torch.zeros(4, dtype=torch.float32)), "uint8 or int8"),
        (lambda: float_to_e2m1(torch.zeros(4, dtype=torch.uint8)), "floating"),
        (lambda: float_to_e2m1(torch.tensor([1.0, float("nan")])), "NaN"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
