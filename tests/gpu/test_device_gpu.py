"""The torch codecs (formats/marlin/torch_route.py, which validate --kernel uses to prepare a source on
the GPU) give the CPU codecs' bytes on CUDA, and doctor reads the built engine extension, on the GPU.
(The converters' own --device cuda route was withdrawn: docs/PERFORMANCE.md.)

Substitutions: the engine extension is the test build of vLLM 0.33.0's Marlin kernels
(DSV4_MARLIN_MODULE, built by tests/gpu/run.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.torch_route import from_marlin_weight_t, mxfp4_to_marlin_t, nvfp4_to_marlin_t

MODULE = os.environ.get("DSV4_MARLIN_MODULE", "")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_codecs_on_cuda_equal_cpu_on_edge_bytes():
    """Every E4M3 / E8M0 byte value (negatives, subnormals, zero) through both paths."""
    g = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (2, 256, 128), dtype=torch.uint8, generator=g)
    e4m3 = torch.arange(256, dtype=torch.uint8).repeat(2, 256, 1)[..., :16].contiguous()
    e4m3 = (e4m3 + torch.arange(256, dtype=torch.uint8).reshape(1, 256, 1)).view(torch.float8_e4m3fn)
    e4m3 = torch.where(e4m3.view(torch.uint8) & 0x7F == 0x7F, torch.zeros_like(e4m3.view(torch.uint8)),
                       e4m3.view(torch.uint8)).view(torch.float8_e4m3fn)
    e8m0 = torch.randint(0, 249, (2, 256, 8), dtype=torch.uint8, generator=g)
    for engine, act, sf in (("vllm", "bfloat16", 8.0), ("vllm", "float16", 1.0), ("sglang", "bfloat16", 1.0)):
        t = MarlinTarget(engine, act)
        cpu = nvfp4_to_marlin(packed, e4m3, target=t, sf=sf)
        gpu = nvfp4_to_marlin_t(packed.cuda(), e4m3.cuda(), target=t, sf=sf)
        assert all(torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8)) for a, b in zip(cpu, gpu))
    for w4a8 in (False, True):
        t = MarlinTarget("vllm", "bfloat16", w4a8)
        cpu = mxfp4_to_marlin(packed, e8m0, target=t)
        gpu = mxfp4_to_marlin_t(packed.cuda(), e8m0.cuda(), target=t)
        assert all(torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8)) for a, b in zip(cpu, gpu))
        assert torch.equal(from_marlin_weight_t(gpu[0], w4a8=w4a8).cpu(), packed)


@pytest.mark.skipif(not os.path.isfile(MODULE), reason="DSV4_MARLIN_MODULE is not a built extension")
def test_doctor_reads_sm90_sass_from_the_built_extension():
    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "doctor", "--json", "--kernel-module", MODULE],
                          capture_output=True, text=True)
    data = json.loads(proc.stdout)
    ext = next(x for x in data["extensions"] if x["engine"] == "module")
    assert 90 in ext["sass"], ext
    assert any(v == "sm_90: SASS" for v in ext["verdict"])
    assert data["gpus"] and data["gpus"][0]["sm"] == 90
    record = os.environ.get("DSV4_GPU_RESULTS")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"doctor": {"gpus": data["gpus"], "extension": ext, "exit_code": data["exit_code"],
                                           "findings": data["findings"]}}) + "\n")
