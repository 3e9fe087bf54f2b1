"""formats/mxfp4.py: quantize / dequantize, scale choice, bad input."""

import pytest
import torch

from dsv4_convert.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from tests.helpers.compare import assert_bytes_equal


def test_hand_case_one_block():
    w = torch.zeros(1, 32)
    w[0, :3] = torch.tensor([12.0, -1.0, 3.0])  # amax 12 = 6 * 2**1 -> scale byte 128
    packed, scale = quantize_mxfp4(w)
    assert scale.tolist() == [[128]]
    assert packed[0, :2].tolist() == [0b1001_0111, 0b0000_0011]  # 6 | -0.5 << 4, 1.5 | 0 << 4
    assert_bytes_equal(dequantize_mxfp4(packed, scale), w)


def test_all_zero_block_gets_scale_one():
    assert quantize_mxfp4(torch.zeros(2, 64))[1].unique().tolist() == [127]


@pytest.mark.parametrize("seed", range(3))
def test_representable_values_come_back_exactly(seed):
    gen = torch.Generator().manual_seed(seed)
    values = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6])
    w = values[torch.randint(0, 15, (3, 32, 64), generator=gen)]
    w[..., ::32] = -6.0
    exps = torch.randint(-20, 20, (3, 32, 2), generator=gen).float()
    w = (w.reshape(3, 32, 2, 32) * torch.exp2(exps).unsqueeze(-1)).reshape(3, 32, 64)
    packed, scale = quantize_mxfp4(w)
    assert_bytes_equal(scale, (exps + 127).to(torch.uint8))
    assert_bytes_equal(dequantize_mxfp4(packed, scale), w)


def test_e8m0_dtype_scales_dequantize_like_bytes():
    packed, scale = quantize_mxfp4(torch.randn(8, 64, generator=torch.Generator().manual_seed(0)))
    assert_bytes_equal(dequantize_mxfp4(packed, scale.view(torch.float8_e8m0fnu)), dequantize_mxfp4(packed, scale))


def test_k_not_a_multiple_of_the_group_raises():
    with pytest.raises(ValueError, match="multiple of 32, got K=48"):
        quantize_mxfp4(torch.ones(4, 48))
    with pytest.raises(ValueError, match="expected K/32 = 1"):
        dequantize_mxfp4(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8))
