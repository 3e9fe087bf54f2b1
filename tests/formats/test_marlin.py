"""formats/marlin/projection.py: whole projections through Marlin and back, dequantized values, padding, targets."""

import pytest
import torch

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import marlin_to_mxfp4, marlin_to_nvfp4, mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import marlin_to_nvfp4_global, vllm_rescale_factor
from dsv4_convert.formats.marlin.weight import from_marlin_weight
from dsv4_convert.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from dsv4_convert.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from dsv4_convert.formats.tiles import padded_dense_nk, padded_moe_intermediate
from tests.helpers.compare import assert_bytes_equal
from tests.helpers.engine_stacks import nvfp4_dense_to_marlin, nvfp4_moe_to_marlin

VLLM_PAD = ENGINES["vllm"].padding

NV_TARGETS = [MarlinTarget(engine=e, act_dtype=a) for e in ("vllm", "sglang") for a in ("bfloat16", "float16")]
MX_TARGETS = [MarlinTarget(engine="vllm"), MarlinTarget(engine="sglang"), MarlinTarget(engine="vllm", w4a8=True)]


def _weights(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("target", NV_TARGETS, ids=lambda t: f"{t.engine}-{t.act_dtype}")
@pytest.mark.parametrize(("shape", "seed"), [((64, 128), 0), ((3, 128, 64), 1), ((192, 256), 2)])
def test_nvfp4_dequantized_values_survive_marlin(target, shape, seed):
    packed, scale, g = quantize_nvfp4(_weights(shape, seed))
    sf = vllm_rescale_factor(scale, target.act_dtype) if target.engine == "vllm" else 1.0
    q, ms = nvfp4_to_marlin(packed, scale, target=target, sf=sf)
    n, k = shape[-2], shape[-1]
    assert q.shape == (*shape[:-2], k // 16, 2 * n) and ms.shape == (*shape[:-2], k // 16, n)
    back, back_scale = marlin_to_nvfp4(q, ms, target=target, n=n, k=k, sf=sf)
    assert_bytes_equal(back, packed)
    assert_bytes_equal(back_scale.view(torch.uint8), scale.view(torch.uint8))
    assert_bytes_equal(dequantize_nvfp4(back, back_scale, g), dequantize_nvfp4(packed, scale, g))


@pytest.mark.parametrize("act_dtype", ["bfloat16", "float16"])
def test_nvfp4_dense_small_scales_vllm_recovers_global_and_values(act_dtype):
    # global 1 -> block scales far below 448: vLLM lifts them by sf (bf16 only) and clamps what stays < 2
    w = _weights((128, 128), 3, scale=0.05)
    packed, scale, _ = quantize_nvfp4(w, global_scale=torch.tensor(1.0))
    target = MarlinTarget(engine="vllm", act_dtype=act_dtype)
    out = nvfp4_dense_to_marlin(packed, scale, torch.tensor([1.0]), target=target)
    sf = vllm_rescale_factor(scale, act_dtype)
    assert (sf > 1) == (act_dtype == "bfloat16")
    g = marlin_to_nvfp4_global(out["weight_global_scale"], act_dtype=act_dtype, sf=sf)
    assert g.item() == 1.0
    back, back_scale = marlin_to_nvfp4(out["weight"], out["weight_scale"], target=target, n=128, k=128, sf=sf)
    lost = scale.float() * 128 * sf < 2
    kept = ~lost.repeat_interleave(16, dim=-1)
    assert_bytes_equal(back, packed)
    assert_bytes_equal(back_scale.view(torch.uint8)[~lost], scale.view(torch.uint8)[~lost])
    assert_bytes_equal(dequantize_nvfp4(back, back_scale, g)[kept], dequantize_nvfp4(packed, scale, g)[kept])


def test_sglang_has_no_rescale_even_for_small_scales():
    packed, scale, _ = quantize_nvfp4(_weights((64, 64), 4, scale=0.05), global_scale=torch.tensor(1.0))
    out = nvfp4_dense_to_marlin(packed, scale, torch.tensor([1.0]), target=MarlinTarget(engine="sglang"))
    assert out["weight_global_scale"].dtype == torch.bfloat16 and out["weight_global_scale"].shape == (1,)
    assert out["weight_global_scale"].item() == 2.0 ** (126 - 7)  # g * 2**(B-7), no / sf
    _, back_scale = marlin_to_nvfp4(out["weight"], out["weight_scale"], target=MarlinTarget(), n=64, k=64)
    assert_bytes_equal(back_scale.view(torch.uint8), scale.view(torch.uint8))


@pytest.mark.parametrize("target", MX_TARGETS, ids=lambda t: f"{t.engine}-w4a8={t.w4a8}")
@pytest.mark.parametrize(("shape", "seed"), [((64, 128), 0), ((2, 128, 64), 1), ((96 * 2, 256), 2)])
def test_mxfp4_dequantized_values_survive_marlin(target, shape, seed):
    packed, scale = quantize_mxfp4(_weights(shape, seed))
    n, k = shape[-2], shape[-1]
    q, ms = mxfp4_to_marlin(packed, scale, target=target)
    assert q.shape == (*shape[:-2], k // 16, 2 * n) and ms.dtype == torch.float8_e8m0fnu
    back, back_scale = marlin_to_mxfp4(q, ms, target=target, n=n, k=k)
    assert_bytes_equal(back, packed)
    assert_bytes_equal(back_scale.view(torch.uint8), scale)
    assert_bytes_equal(dequantize_mxfp4(back, back_scale), dequantize_mxfp4(packed, scale))


@pytest.mark.parametrize(("n", "k", "group", "expected"), [
    (64, 128, 16, (64, 128)), (100, 128, 16, (128, 128)), (64, 96, 16, (64, 128)),
    (64, 96, 32, (64, 128)), (192, 64, 32, (256, 64)), (256, 160, 32, (256, 192)),
])
def test_padded_dense_nk(n, k, group, expected):
    assert padded_dense_nk(n, k, group) == expected


def test_padded_moe_intermediate():
    assert padded_moe_intermediate(96, 4096, VLLM_PAD) == 128
    assert padded_moe_intermediate(96, 4160, VLLM_PAD) == 128
    assert padded_moe_intermediate(160, 4096, VLLM_PAD) == 192
    assert padded_moe_intermediate(160, 4160, VLLM_PAD) == 256


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_padding_is_zeros_and_crops_back(fmt):
    n, k, n_pad, k_pad = 100, 96, 128, 128
    if fmt == "nvfp4":
        packed, scale, _ = quantize_nvfp4(_weights((n, k), 5))
        q, ms = nvfp4_to_marlin(packed, scale, target=MarlinTarget(), n_pad=n_pad, k_pad=k_pad)
        back, back_scale = marlin_to_nvfp4(q, ms, target=MarlinTarget(), n=n, k=k)
    else:
        packed, scale = quantize_mxfp4(_weights((n, k), 5))
        q, ms = mxfp4_to_marlin(packed, scale, target=MarlinTarget(), n_pad=n_pad, k_pad=k_pad)
        back, back_scale = marlin_to_mxfp4(q, ms, target=MarlinTarget(), n=n, k=k)
    assert q.shape == (k_pad // 16, 2 * n_pad)
    full = from_marlin_weight(q)
    assert torch.count_nonzero(full[n:]).item() == 0 and torch.count_nonzero(full[:, k // 2:]).item() == 0
    assert_bytes_equal(back, packed)
    assert_bytes_equal(back_scale.view(torch.uint8), scale.view(torch.uint8))


def test_nvfp4_moe_pads_gate_and_up_separately():
    e, i, i_pad, h = 2, 96, 128, 128
    w13, s13, _ = quantize_nvfp4(_weights((e, 2 * i, h), 6), global_scale=torch.tensor(0.01))
    w2, s2, _ = quantize_nvfp4(_weights((e, h, i), 7), global_scale=torch.tensor(0.01))
    g13, g2 = torch.full((e, 2), 0.01), torch.full((e,), 0.01)
    out = nvfp4_moe_to_marlin(w13, s13, g13, w2, s2, g2, target=MarlinTarget(engine="vllm"), i_pad=i_pad)
    assert out["w13_weight"].shape == (e, h // 16, 4 * i_pad) and out["w2_weight"].shape == (e, i_pad // 16, 2 * h)
    rows = from_marlin_weight(out["w13_weight"])
    assert_bytes_equal(rows[:, :i], w13[:, :i])
    assert_bytes_equal(rows[:, i_pad:i_pad + i], w13[:, i:])
    assert torch.count_nonzero(rows[:, i:i_pad]).item() == 0 and torch.count_nonzero(rows[:, i_pad + i:]).item() == 0
    assert_bytes_equal(from_marlin_weight(out["w2_weight"])[..., : i // 2], w2)


def test_target_validation():
    with pytest.raises(ValueError, match="unknown engine 'tensorrt'"):
        MarlinTarget(engine="tensorrt")
    with pytest.raises(ValueError, match="unknown activation dtype 'float32'"):
        MarlinTarget(act_dtype="float32")
    with pytest.raises(ValueError, match="only in vLLM"):
        MarlinTarget(engine="sglang", w4a8=True)
    assert MarlinTarget(engine="vllm").layout_tag == "vllm-L4"
    assert MarlinTarget(engine="sglang").layout_tag == "sglang-L2"


_NV = quantize_nvfp4(torch.ones(64, 64))
_MX = quantize_mxfp4(torch.ones(64, 64))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: nvfp4_to_marlin(_NV[0], _NV[1], target=MarlinTarget(engine="vllm", w4a8=True)), "no W4A8"),
        (lambda: mxfp4_to_marlin(*_MX, target=MarlinTarget(act_dtype="float16")), "bfloat16 activations only"),
        (lambda: nvfp4_to_marlin(_NV[0].float(), _NV[1], target=MarlinTarget()), "uint8 or int8"),
        (lambda: mxfp4_to_marlin(_MX[0][:, :24], _MX[1][:, :1], target=MarlinTarget()),
         "K=48 .* not a multiple of the group size 32"),
        (lambda: nvfp4_to_marlin(_NV[0], _NV[1][:, :2], target=MarlinTarget()), r"shape \[64, 2\], expected \[64, 4\]"),
        (lambda: nvfp4_to_marlin(_NV[0][:48], _NV[1][:48], target=MarlinTarget()), "N=48"),
        (lambda: mxfp4_to_marlin(_MX[0][:48], _MX[1][:48], target=MarlinTarget(engine="vllm", w4a8=True)),
         r"N=48, K=64 .*32 in N"),
        (lambda: nvfp4_to_marlin(_NV[0], _NV[1], target=MarlinTarget(), n_pad=32), "cannot pad"),
        (lambda: nvfp4_dense_to_marlin(_NV[0], _NV[1], torch.tensor([float("nan")]), target=MarlinTarget()),
         "finite and > 0"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
