"""SGLang 0.5.23's own Marlin kernels on the GPU (tests/gpu/run.sh's `sglang` build): its JIT MoE GEMM against
vLLM's kernel on the same SGLang-target bytes and against the fp32 reference; doctor's report of SGLang's JIT
path; and a JIT that cannot build, which must be the kernel.build finding, never a traceback.

Substitutions: SGLang is the test build of the sglang 0.5.23 wheel's JIT sources and loader
(tests/gpu/sglang_kernels, prepared into .sglang-kernels: files unchanged, package __init__s and two functions of
sglang/srt/utils/common.py stood in, sgl_kernel/scalar_type.py from sglang-kernel 0.4.10); vLLM's kernel is
the test build of vLLM 0.33.0's (DSV4_MARLIN_MODULE). Checkpoints are `synth` outputs converted by the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Quant, Role
from dsv4_convert.core.sources.source_formats import source_format
from dsv4_convert.formats.marlin.scales import marlin_to_nvfp4_global
from dsv4_convert.validate.checks.kernel import KERNEL_REL_ERROR_MAX
from dsv4_convert.validate.kernel_moe import Stack, dequant, reference_product, rel_errors, run_stack
from dsv4_convert.validate.kernel_provider import select_provider
from tests.helpers.kernel_cli import ENGINE, MODULE, kernel, record, run_cli, status

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ENGINE == "sglang"),
                                reason="needs a CUDA GPU and SGLang's kernels (DSV4_KERNEL_ENGINE=sglang, tests/gpu/run.sh)")


def _stack(src, out, act: str) -> Stack:
    """Every expert's down projection of layer 0, as converted (the kernel's bytes) and as the source means it
    with the global the checkpoint keeps (SGLang: the activation dtype's; no rescale for SGLang)."""
    ckpt, sck = open_checkpoint(out), open_checkpoint(src)
    refs = {p.key: p for p in sck.projections}
    qs, ss, gs, ref = [], [], [], []
    with TensorReader(ckpt.root) as r, TensorReader(sck.root) as sr:
        for p in sorted((p for p in ckpt.projections if p.layer == "0" and p.role is Role.DOWN), key=lambda p: p.expert):
            d = load_projection(r, p, fmt=source_format("marlin"))
            w = load_projection(sr, refs[p.key], fmt=sck.format)
            kept = None
            if p.quant is Quant.NVFP4:
                g = r.get(p.marlin_global).float().reshape(())
                gs.append(g)
                kept = marlin_to_nvfp4_global(g, act_dtype=act)
            qs.append(d.weight)
            ss.append(d.scale)
            ref.append(dequant(p.quant.value, w.weight, w.scale, kept))
    dev = "cuda"
    return Stack(torch.stack(qs).to(dev), torch.stack(ss).to(dev), torch.stack(gs).to(dev) if gs else None,
                 torch.stack(ref).to(dev))


@pytest.mark.skipif(not os.path.isfile(MODULE), reason="needs vLLM's kernel build too (DSV4_MARLIN_MODULE)")
@pytest.mark.parametrize("fmt,act", [("nvfp4-modelopt-dsv4", "bfloat16"), ("nvfp4-modelopt-dsv4", "float16"),
                                     ("nvfp4-ct", "float16"), ("mxfp4-dsv4", "bfloat16")])
def test_sglang_and_vllm_kernels_on_the_same_sglang_bytes(tmp_path, fmt, act):
    src, out = tmp_path / "src", tmp_path / "out"
    run_cli("synth", src, "--format", fmt, "--layers", "1", "--experts", "8")
    run_cli("nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin", src, out, "--target", "sglang",
            "--act-dtype", act, "-q")
    stack = _stack(src, out, act)
    sglang, vllm = select_provider("sglang", None), select_provider(f"module:{MODULE}", None)
    x = torch.randn(16, stack.reference.shape[-1], generator=torch.Generator(device="cuda").manual_seed(0),
                    device="cuda").to(getattr(torch, act))
    ys, yv = run_stack(sglang, stack, x), run_stack(vllm, stack, x)
    ref = reference_product(stack, x)
    rs, rv, rsv = rel_errors(ys, ref), rel_errors(yv, ref), rel_errors(ys, yv)
    same = float((ys == yv).float().mean())
    record(sglang_vs_vllm=f"{fmt}/{act}", sglang_rel_max=float(rs.max()), vllm_rel_max=float(rv.max()),
           sglang_vs_vllm_rel_max=float(rsv.max()), bitwise_equal_fraction=same, provider=sglang.name)
    assert float(rs.max()) <= KERNEL_REL_ERROR_MAX[act] and float(rv.max()) <= KERNEL_REL_ERROR_MAX[act]
    # the same bytes through two builds of the same Marlin code: only the global's product differs. SGLang rounds the
    # output to the activation dtype, then multiplies it by the global rounded to that dtype (__hmul2) and rounds
    # again; vLLM multiplies in fp32 before its one rounding. Per element that is up to 4 unit roundoffs u apart
    # (u = 2**-8 bf16, 2**-11 fp16), and about 2u/sqrt(3) as a root mean square of independent roundings: the
    # Frobenius bound is 2u. Measured on an H100 (synth, 1 layer x 8 experts): bf16 3.1e-3 (0.8u), fp16 3.8e-4 (0.8u),
    # with 74% of the elements bit-equal; MXFP4 (no global) bit-identical.
    assert float(rsv.max()) <= torch.finfo(getattr(torch, act)).eps  # eps = 2u
    if fmt.startswith("mxfp4"):  # no global: the same arithmetic
        assert same == 1.0


def _doctor(*extra, env=None):
    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "doctor", "--json", *extra],
                          capture_output=True, text=True, env=env)
    return json.loads(proc.stdout)


def test_doctor_names_sglangs_jit_path_and_its_built_kernels(tmp_path):
    """After run.sh's build (SGLang's own JIT, its cache in $SGLANG_JIT_CACHE_DIR): the toolkit, the target
    SGLang compiles for this GPU (sm_90a on Hopper), and the built MoE GEMM's SASS for it."""
    data = _doctor()
    (jit,) = data["jit"]
    gpu = data["gpus"][0]
    record(doctor_sglang={"jit": jit, "gpus": data["gpus"], "findings": data["findings"]})
    assert jit["toolkit"]["nvcc"] and all(jit["sources"].values()) and all(jit["needs"].values()), jit
    assert jit["targets"][0]["target"] == f"sm_{gpu['sm']}" + ("a" if gpu["sm"] >= 90 else "")
    moe = [x for x in data["extensions"] if "moe_wna16_marlin" in x["library"]]
    assert moe and all(gpu["sm"] in x["sass"] for x in moe), data["extensions"]
    assert not [f for f in data["findings"] if "compiles its Marlin" in f], data["findings"]


def test_a_jit_that_cannot_build_is_the_kernel_build_finding(tmp_path):
    """No toolkit where SGLang's JIT looks first ($CUDA_HOME) and an empty cache: validate --kernel exits 1 with
    the kernel.build finding that says what to install; doctor says the same before any build."""
    src = tmp_path / "src"
    run_cli("synth", src, "--layers", "1", "--experts", "2")
    env = {**os.environ, "CUDA_HOME": str(tmp_path / "no-cuda"), "SGLANG_JIT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "validate", str(src), "--kernel",
                           "--kernel-provider", "sglang", "--target", "sglang", "--json", "-q"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    (f,) = [f for f in data["findings"] if f["check"] == "kernel.build"]
    assert status(data, "kernel.build") == "fail" and "install a CUDA toolkit" in f["message"], f
    doc = _doctor(env=env)
    assert any("there is none at" in x and "no-cuda" in x for x in doc["findings"]), doc["findings"]
    record(jit_cannot_build=f["message"][:600], doctor=[x for x in doc["findings"] if "nvcc" in x])


def test_kernel_provider_sglang_runs_sglangs_own_op(tmp_path):
    """The provider validate picks for an SGLang-target checkpoint (auto, SGLang installed) is SGLang's JIT op."""
    src, out = tmp_path / "src", tmp_path / "out"
    run_cli("synth", src, "--layers", "1", "--experts", "4")
    run_cli("nvfp4-to-marlin", src, out, "--target", "sglang", "-q")
    data = kernel(out, "auto", "--against", src, check_rc=0)
    assert any("kernel: sglang 0.5.23 (JIT)" in n for n in data["summary"]["notes"]), data["summary"]["notes"]
    assert status(data, "kernel.build") == "pass" and status(data, "kernel.repack") == "pass"
