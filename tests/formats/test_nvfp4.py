"""formats/nvfp4.py: quantize / dequantize, global-scale conventions, bad input."""

import pytest
import torch

from dsv4_convert.formats.nvfp4 import (
    dequantize_nvfp4,
    global_from_ct,
    global_to_ct,
    nvfp4_global_for,
    quantize_nvfp4,
)
from tests.helpers.compare import assert_bytes_equal


def test_hand_case_one_block():
    w = torch.tensor([[6.0, -3.0, 0.5, 0.0] + [0.0] * 12])
    packed, scale, g = quantize_nvfp4(w, global_scale=torch.tensor(1.0))
    assert scale.float().item() == 1.0
    assert packed[0, :2].tolist() == [0b1101_0111, 0b0000_0001]  # 6 | -3 << 4, 0.5 | 0 << 4
    assert_bytes_equal(dequantize_nvfp4(packed, scale, g), w)


@pytest.mark.parametrize("seed", range(3))
def test_representable_values_come_back_exactly(seed):
    gen = torch.Generator().manual_seed(seed)
    codes_values = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6])
    w = codes_values[torch.randint(0, 15, (2, 64, 64), generator=gen)]
    w[..., ::16] = 6.0  # every block reaches the E2M1 max, so the block scale is exactly 1 * g
    g = torch.tensor(2.0**-3)
    packed, scale, g_out = quantize_nvfp4(w * g, global_scale=g)
    assert packed.shape == (2, 64, 32) and scale.shape == (2, 64, 4) and scale.dtype == torch.float8_e4m3fn
    assert_bytes_equal(dequantize_nvfp4(packed, scale, g_out), w * g)


def test_requantizing_a_dequantized_tensor_is_a_fixed_point():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    packed, scale, g = quantize_nvfp4(w)
    again = quantize_nvfp4(dequantize_nvfp4(packed, scale, g), global_scale=g)
    assert_bytes_equal(again[0], packed)
    assert_bytes_equal(again[1], scale)


def test_global_conventions():
    assert nvfp4_global_for(2688.0).item() == 1.0  # amax / (6 * 448)
    assert nvfp4_global_for(0.0).item() == 1.0
    g = torch.tensor(2.0**-5)
    assert_bytes_equal(global_from_ct(global_to_ct(g)), g)
    assert global_from_ct(torch.tensor([4.0, 8.0])).item() == 0.125  # 1 / max over partitions


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_global_raises(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        quantize_nvfp4(torch.ones(4, 16), global_scale=torch.tensor(bad))


def test_nan_weights_raise():
    w = torch.ones(4, 16)
    w[1, 3] = float("nan")
    with pytest.raises(ValueError, match="finite and > 0|NaN"):
        quantize_nvfp4(w)


def test_k_not_a_multiple_of_the_group_raises():
    with pytest.raises(ValueError, match="multiple of 16, got K=24"):
        quantize_nvfp4(torch.ones(4, 24))
    with pytest.raises(ValueError, match="expected K/16 = 2"):
        dequantize_nvfp4(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8), torch.ones(()))
