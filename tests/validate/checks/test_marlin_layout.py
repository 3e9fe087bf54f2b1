"""Converted projections vs their source: clean passes; each classic mistake is named."""

import pytest
import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import marlin_to_nvfp4
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin
from dsv4_convert.formats.marlin.weight import to_marlin_weight
from dsv4_convert.validate.checks import marlin_layout as c
from dsv4_convert.validate.diagnose import swap_nibbles
from dsv4_convert.validate.inputs import ProjectionTensors
from tests.helpers.checks import marlin_of, mxfp4_tensors, nvfp4_tensors, run


def _decoded(m):
    packed, scale = marlin_to_nvfp4(m.qweight, m.mscale, target=m.target,
                                    n=m.proj.n, k=m.proj.k, sf=m.sf)
    m.decoded = ProjectionTensors(m.proj, packed, scale, m.kept_global, m.sf)
    return m


def _all(m):
    return run(c.layout_weight, m) + run(c.layout_scale, m) + run(c.layout_global, m)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("act", ["bfloat16", "float16"])
def test_clean_conversion_passes(engine, act):
    assert _all(_decoded(marlin_of(nvfp4_tensors(), engine=engine, act_dtype=act))) == []


def test_clean_mxfp4_passes():
    from dsv4_convert.formats.marlin import marlin_to_mxfp4
    m = marlin_of(mxfp4_tensors())
    w, s = marlin_to_mxfp4(m.qweight, m.mscale, target=MarlinTarget(), n=128, k=256)
    m.decoded = ProjectionTensors(m.proj, w, s.view(torch.uint8))
    assert run(c.layout_weight, m) + run(c.layout_scale, m) == []


def test_two_tiles_swapped():
    m = marlin_of(nvfp4_tensors())
    q = m.qweight.clone()  # row kt holds N/64 tiles of 128 int32; swap tiles (kt=3, c=0) and (kt=5, c=1)
    a, b = q[3, 0:128].clone(), q[5, 128:256].clone()
    q[3, 0:128], q[5, 128:256] = b, a
    m.qweight = q
    (f,) = run(c.layout_weight, _decoded(m))
    assert "wrong tile order" in f.cause and "(kt=3, c=0) holds the source tile (kt=5, c=1)" in f.cause
    assert f.first[0] < 64 and "Likely cause: wrong tile order" in f.message


def test_scales_not_permuted():
    src = nvfp4_tensors()
    m = marlin_of(src)
    from dsv4_convert.formats.marlin.scales import nvfp4_scales_to_s0e5m3
    m.mscale = nvfp4_scales_to_s0e5m3(src.scale.transpose(0, 1), clamp=False).view(torch.float8_e4m3fn)
    (f,) = run(c.layout_scale, _decoded(m))
    assert f.cause.startswith("scales not permuted")


def test_nibbles_swapped():
    src = nvfp4_tensors()
    m = marlin_of(src)
    m.qweight = to_marlin_weight(swap_nibbles(src.weight))
    (f,) = run(c.layout_weight, _decoded(m))
    assert f.cause.startswith("swapped nibbles")


def test_wrong_targets_global():
    src = nvfp4_tensors()
    m = marlin_of(src, engine="sglang")
    m.mglobal = nvfp4_global_to_marlin(src.global_scale, fp32_global=True, act_dtype="bfloat16")
    (f,) = run(c.layout_global, _decoded(m))
    assert "wrong target: global processed for vllm/bfloat16" in f.cause and f.tensor.endswith("weight_global_scale")


def test_wrong_targets_scales():
    src = nvfp4_tensors()
    src.scale = (src.scale.float() / 1024).to(torch.float8_e4m3fn)  # small scales: vLLM rescales (sf = 1024)
    m = marlin_of(src, engine="sglang")
    from dsv4_convert.formats.marlin import nvfp4_to_marlin
    from dsv4_convert.formats.marlin.scales import vllm_rescale_factor
    sf = vllm_rescale_factor(src.scale, "bfloat16")
    assert sf > 1
    _, m.mscale = nvfp4_to_marlin(src.weight, src.scale, target=MarlinTarget(engine="vllm"), sf=sf)
    (f,) = run(c.layout_scale, _decoded(m))
    assert f.cause.startswith("wrong target: scales processed for vllm")


def test_self_consistency_without_reference():
    m = marlin_of(nvfp4_tensors(), engine="vllm")
    m.reference = None
    assert _all(_decoded(m)) == []
    b = m.mscale.view(torch.uint8).clone()
    b[0, 0] = 0x10  # vLLM never writes a non-zero byte below 0x80
    m.mscale = b.view(torch.float8_e4m3fn)
    (f,) = run(c.layout_scale, _decoded(m))
    assert "re-encoding of its own decoded scales" in f.message
