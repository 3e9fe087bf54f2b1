"""formats/marlin/scales.py: the §3 closed forms, value processing for both engines, inverses."""

import pytest
import torch

from dsv4_convert.formats.marlin.scales import (
    marlin_to_mxfp4_scales,
    marlin_to_nvfp4_global,
    mxfp4_scales_to_marlin,
    nvfp4_global_to_marlin,
    nvfp4_scales_to_s0e5m3,
    permute_scale_columns,
    s0e5m3_to_nvfp4_scales,
    unpermute_scale_columns,
    vllm_rescale_factor,
)
from tests.helpers.compare import assert_bytes_equal

QUAD = (0, 2, 1, 3)
SG = (0, 1, 8, 9, 16, 17, 24, 25)
ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
FINITE_E4M3 = torch.cat((ALL_BYTES[:0x7F], ALL_BYTES[0x80:0xFF]))  # all but the two NaN bytes


def _reference_a16(s: torch.Tensor) -> torch.Tensor:
    """§3.2: out[r, 64c + q] = S[r, 64c + 8*(p % 8) + p // 8], p = 4*(q // 4) + QUAD[q % 4]."""
    out = torch.empty_like(s)
    for c in range(s.shape[-1] // 64):
        for q in range(64):
            p = 4 * (q // 4) + QUAD[q % 4]
            out[..., 64 * c + q] = s[..., 64 * c + 8 * (p % 8) + p // 8]
    return out


def _reference_single(s: torch.Tensor) -> torch.Tensor:
    """§3.1 scale_perm_single: out[32c + 8i + m] = in[32c + 2i + SG[m]]."""
    out = torch.empty_like(s)
    for c in range(s.shape[-1] // 32):
        for i in range(4):
            for m in range(8):
                out[..., 32 * c + 8 * i + m] = s[..., 32 * c + 2 * i + SG[m]]
    return out


def _random_bytes(shape, seed):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(1, 64), (3, 128), (2, 4, 192)])
def test_a16_permutation_matches_closed_form_and_inverts(shape):
    s = _random_bytes(shape, sum(shape))
    out = permute_scale_columns(s)
    assert_bytes_equal(out, _reference_a16(s))
    assert_bytes_equal(unpermute_scale_columns(out), s)


@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (2, 2, 64)])
def test_w4a8_permutation_matches_scale_perm_single_and_inverts(shape):
    s = _random_bytes(shape, sum(shape) + 1)
    out = permute_scale_columns(s, w4a8=True)
    assert_bytes_equal(out, _reference_single(s))
    assert_bytes_equal(unpermute_scale_columns(out, w4a8=True), s)


def test_a16_forward_map_hand_case():
    # source column 9 (n % 8 = 1, j = 1) -> 8*1 + 4*0 + QUAD[1] = 10
    s = torch.zeros(1, 64, dtype=torch.uint8)
    s[0, 9] = 1
    assert permute_scale_columns(s)[0].nonzero().flatten().tolist() == [10]


def test_permutation_needs_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 64"):
        permute_scale_columns(torch.zeros(1, 96, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 32"):
        permute_scale_columns(torch.zeros(1, 48, dtype=torch.uint8), w4a8=True)


def _e4m3(b: torch.Tensor) -> torch.Tensor:
    return b.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("sf", [1.0, 4.0])
def test_vllm_s0e5m3_roundtrip_exact_except_the_clamped(sf):
    # vLLM picks sf so that max(scale) * sf <= 448: only such tensors ever meet a given sf
    src = FINITE_E4M3[_e4m3(FINITE_E4M3).float() * sf <= 448]
    assert vllm_rescale_factor(_e4m3(src), "bfloat16") == sf
    back = s0e5m3_to_nvfp4_scales(nvfp4_scales_to_s0e5m3(_e4m3(src), clamp=True, sf=sf), sf=sf)
    back = back.view(torch.uint8)
    clamped = _e4m3(src).float() * 128 * sf < 2  # +-0, subnormals not lifted by sf, and every negative
    assert torch.equal(back != src, clamped & (src != 0))
    assert torch.all(back[clamped] == 0)
    assert clamped.sum().item() > 100  # the negatives alone


def test_sglang_s0e5m3_roundtrip_exact_except_the_sign():
    back = s0e5m3_to_nvfp4_scales(nvfp4_scales_to_s0e5m3(_e4m3(FINITE_E4M3), clamp=False)).view(torch.uint8)
    negative = FINITE_E4M3 >= 0x80  # -0.0 included: its sign is lost too
    assert torch.equal(back != FINITE_E4M3, negative)
    assert_bytes_equal(back[negative], FINITE_E4M3[negative] & 0x7F)


def test_s0e5m3_bytes_of_vllm_are_zero_or_at_least_0x80():
    b = nvfp4_scales_to_s0e5m3(_e4m3(FINITE_E4M3), clamp=True)
    assert torch.all((b == 0) | (b >= 0x80))


def test_rescale_factor():
    normal = torch.tensor([1.0, 448.0, 0.0]).to(torch.float8_e4m3fn)
    small = torch.tensor([0.0, 0.25, 1.0]).to(torch.float8_e4m3fn)  # max 1.0 -> 448 = 2**8.8 -> 2**8
    assert vllm_rescale_factor(normal, "bfloat16") == 1.0
    assert vllm_rescale_factor(torch.tensor([240.0]).to(torch.float8_e4m3fn), "bfloat16") == 1.0
    assert vllm_rescale_factor(torch.tensor([208.0]).to(torch.float8_e4m3fn), "bfloat16") == 2.0
    assert vllm_rescale_factor(small, "bfloat16") == 256.0
    assert vllm_rescale_factor([small, normal], "bfloat16") == 1.0  # one factor for the whole stack
    assert vllm_rescale_factor(torch.zeros(4).to(torch.float8_e4m3fn), "bfloat16") == 1.0
    assert vllm_rescale_factor(small, "float16") == 1.0
    with pytest.raises(ValueError, match="no rescale factor"):
        nvfp4_global_to_marlin(torch.ones(1), fp32_global=False, act_dtype="bfloat16", sf=256.0)


@pytest.mark.parametrize("act_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("sf", [1.0, 2.0, 512.0])
def test_vllm_global_roundtrip_is_exact(act_dtype, sf):
    g = torch.rand(64, generator=torch.Generator().manual_seed(0)) * 0.1 + 1e-4
    gm = nvfp4_global_to_marlin(g, fp32_global=True, act_dtype=act_dtype, sf=sf)
    assert gm.dtype == torch.float32
    assert_bytes_equal(marlin_to_nvfp4_global(gm, act_dtype=act_dtype, sf=sf), g)


@pytest.mark.parametrize("act_dtype", ["bfloat16", "float16"])
def test_sglang_global_is_in_the_activation_dtype(act_dtype):
    g = torch.tensor([0.5, 2.0**-10])
    gm = nvfp4_global_to_marlin(g, fp32_global=False, act_dtype=act_dtype)
    assert gm.dtype == getattr(torch, act_dtype)
    assert_bytes_equal(marlin_to_nvfp4_global(gm, act_dtype=act_dtype), g)  # powers of two survive


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_global_raises(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        nvfp4_global_to_marlin(torch.tensor([1.0, bad]), fp32_global=True, act_dtype="bfloat16")


def test_unknown_dtype_raises():
    with pytest.raises(ValueError, match="unknown activation dtype"):
        nvfp4_global_to_marlin(torch.ones(1), fp32_global=True, act_dtype="float32")


def test_mxfp4_scales_roundtrip():
    a16 = mxfp4_scales_to_marlin(ALL_BYTES.view(torch.float8_e8m0fnu))
    assert_bytes_equal(a16, ALL_BYTES)
    assert_bytes_equal(marlin_to_mxfp4_scales(a16), ALL_BYTES)
    ok = ALL_BYTES[:249]  # 0..248: 249 + 6 = 255 would decode as Inf in the kernel
    w4a8 = mxfp4_scales_to_marlin(ok, w4a8=True)
    assert w4a8[127].item() == 133  # 2**0 -> +6
    assert_bytes_equal(marlin_to_mxfp4_scales(w4a8, w4a8=True), ok)
    with pytest.raises(ValueError, match="<= 248"):
        mxfp4_scales_to_marlin(ALL_BYTES[249:250], w4a8=True)
