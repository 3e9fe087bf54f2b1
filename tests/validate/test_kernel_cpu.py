"""The CPU side of `validate --kernel` and `--device cuda`: provider selection and refusal, the MoE
routing contract, the torch transforms against the numpy codecs, the refusals without a GPU.

Substitutions: none. CI has no GPU and no engine, so the engine providers are tested for selection
and refusal only (the GPU suite, tests/gpu, runs the real kernels); the refusal tests skip where a
GPU is present.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dsv4_convert.core.errors import UsageError
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.torch_route import (
    from_marlin_weight_t,
    mxfp4_to_marlin_t,
    nvfp4_to_marlin_t,
    to_marlin_weight_t,
)
from dsv4_convert.formats.marlin.weight import from_marlin_weight, to_marlin_weight
from dsv4_convert.validate.kernel_moe import moe_align
from dsv4_convert.validate.kernel_provider import _order, select_provider

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the refusal on a machine without a GPU")
CLI = [sys.executable, "-m", "dsv4_convert.cli"]


def _bytes_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                    b.contiguous().view(torch.uint8))


# ------------------------------------------------------------------------ torch transforms == codecs
@pytest.mark.parametrize("w4a8", [False, True])
@pytest.mark.parametrize("shape", [(1, 64, 32), (3, 128, 128), (2, 256, 64)])
def test_torch_weight_layout_equals_numpy_codec(shape, w4a8):
    packed = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(sum(shape)))
    q = to_marlin_weight(packed, w4a8=w4a8)
    assert _bytes_equal(to_marlin_weight_t(packed, w4a8=w4a8), q)
    assert _bytes_equal(from_marlin_weight_t(q, w4a8=w4a8), from_marlin_weight(q, w4a8=w4a8))
    assert _bytes_equal(from_marlin_weight_t(q, w4a8=w4a8), packed)


@pytest.mark.parametrize("engine,act,sf", [("vllm", "bfloat16", 8.0), ("vllm", "float16", 1.0),
                                           ("sglang", "bfloat16", 1.0), ("sglang", "float16", 1.0)])
def test_torch_nvfp4_equals_codec_on_every_scale_byte(engine, act, sf):
    packed = torch.randint(0, 256, (2, 128, 128), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    codes = (torch.arange(2 * 128 * 16) % 256).to(torch.uint8).reshape(2, 128, 16)
    codes = torch.where((codes & 0x7F) == 0x7F, torch.zeros_like(codes), codes)  # NaN is refused earlier
    t = MarlinTarget(engine, act)
    for a, b in zip(nvfp4_to_marlin_t(packed, codes.view(torch.float8_e4m3fn), target=t, sf=sf),
                    nvfp4_to_marlin(packed, codes.view(torch.float8_e4m3fn), target=t, sf=sf)):
        assert _bytes_equal(a, b)


@pytest.mark.parametrize("w4a8", [False, True])
def test_torch_mxfp4_equals_codec(w4a8):
    g = torch.Generator().manual_seed(4)
    packed = torch.randint(0, 256, (2, 128, 128), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 249, (2, 128, 8), dtype=torch.uint8, generator=g)
    t = MarlinTarget("vllm", "bfloat16", w4a8)
    for a, b in zip(mxfp4_to_marlin_t(packed, scales, target=t), mxfp4_to_marlin(packed, scales, target=t)):
        assert _bytes_equal(a, b)


# ------------------------------------------------------------------------------------- routing
@pytest.mark.parametrize("block", [8, 16, 64])
def test_moe_align_follows_vllms_contract(block):
    m, top_k, experts = 37, 4, 9
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(i))[:top_k] for i in range(m)])
    sorted_ids, expert_ids, post = moe_align(ids, experts, block)
    numel, total = m * top_k, int(post[0])
    assert sorted_ids.numel() == numel + experts * (block - 1) and total % block == 0
    real = sorted_ids[:total][sorted_ids[:total] < numel]
    assert sorted(real.tolist()) == list(range(numel))  # every (token, slot) exactly once
    assert (sorted_ids[total:] == numel).all()  # the rest is the sentinel
    flat = ids.reshape(-1)
    for b in range(total // block):
        chunk = sorted_ids[b * block:(b + 1) * block]
        chunk = chunk[chunk < numel].long()
        assert (flat[chunk] == expert_ids[b]).all()  # a block holds one expert's tokens


# ----------------------------------------------------------------------------- provider selection
def test_auto_prefers_the_engine_of_the_layout():
    assert _order("sglang-L2") == ["sglang", "vllm"]
    assert _order("vllm-L4") == ["vllm", "sglang"]


@pytest.mark.skipif(any(__import__("importlib").util.find_spec(m) for m in ("vllm", "sglang")),
                    reason="an engine is installed here")
@pytest.mark.parametrize("choice,error_id", [("auto", "kernel.provider_missing"), ("vllm", "kernel.provider_missing"),
                                             ("sglang", "kernel.provider_missing"), ("sgl_kernel", "kernel.provider_unknown"),
                                             ("module", "kernel.provider_missing"),
                                             ("module:/nonexistent/x.so", "kernel.provider_missing"),
                                             ("cutlass", "kernel.provider_unknown")])
def test_provider_refusals_without_an_engine(monkeypatch, choice, error_id):
    monkeypatch.delenv("DSV4_MARLIN_MODULE", raising=False)
    with pytest.raises(UsageError) as e:
        select_provider(choice, "vllm-L4")
    assert e.value.error_id == error_id and e.value.exit_code == 2


def test_module_provider_refuses_a_library_that_is_no_marlin_extension(fixtures_dir):
    with pytest.raises(UsageError) as e:
        select_provider(f"module:{fixtures_dir / 'fatbin' / 'sm90_sass.so'}", None)
    assert e.value.error_id == "kernel.provider_broken"


# ------------------------------------------------------------------------------ no-GPU refusals
@pytest.fixture
def fixtures_dir():
    from pathlib import Path
    return Path(__file__).resolve().parents[1] / "fixtures"


@NO_GPU
@pytest.mark.parametrize("extra,error", [(["--kernel"], "device.no_gpu"), (["--kernel", "--device", "cuda:1"],
                                                                           "device.no_gpu"),
                                         (["--kernel", "--device", "gpu0"], "device.bad_spec")])
def test_validate_kernel_refuses_without_a_gpu(tmp_path, extra, error):
    proc = subprocess.run([*CLI, "validate", tmp_path, *extra], capture_output=True, text=True)
    assert proc.returncode == 2 and f"error[{error}]" in proc.stderr, proc.stderr


def test_kernel_checks_are_registered_and_not_run_without_kernel(tmp_path):
    subprocess.run([*CLI, "synth", tmp_path / "src", "--layers", "1", "--experts", "2"], check=True,
                   capture_output=True)
    proc = subprocess.run([*CLI, "validate", tmp_path / "src", "--json", "--quiet"], capture_output=True,
                          text=True)
    data = json.loads(proc.stdout)
    status = {c["id"]: c["status"] for c in data["checks"]}
    assert status["kernel.gemm"] == "not run" and status["kernel.repack"] == "not run" and data["kernel"] == []
