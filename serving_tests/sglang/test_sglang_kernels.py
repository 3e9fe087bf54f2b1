"""SGLang 0.5.23's Marlin kernels as the engine table says it ships them (core/targets/kernel_table.py), checked against
the real sglang wheel installed here, and `doctor`'s report of them, on CPU: the ops are SGLang's own JIT
functions with the table's argument lists; the sources the JIT compiles are in the package; the target SGLang's
JIT compiles for each GPU (sm_90a, sm_120a / sm_120f by the nvcc version) is the one doctor names.

Substitution: `nvcc` is a made-up script on PATH that answers `--version` as CUDA 12.8 or 13.0 and
`--list-gpu-arch` (the toolkit's version is what SGLang's target choice reads; no compile runs here). SGLang's
own target function (sglang/kernels/jit/utils/arch.py make_jit_cuda_arch) runs in a subprocess with the same
PATH, so both read the same compiler. No GPU: capabilities are passed, as SGLang's own override does.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest
import sglang

from dsv4_convert.core.targets.engines import ENGINES, release_for
from dsv4_convert.core.targets.kernel_table import jit_target
from tests.helpers.cli import CLI

RELEASE = release_for("sglang", "0.5.23")
K = RELEASE.kernels
ROOT = Path(sglang.__file__).parent


def test_the_table_names_sglangs_own_jit_ops_with_their_real_argument_lists():
    from sglang.kernels.ops.moe import moe_wna16_marlin
    from sglang.kernels.ops.quantization import gptq_marlin_repack
    assert (K.build, K.dist, K.module) == ("jit", "sglang", moe_wna16_marlin.__name__)
    assert K.gemm == f"{moe_wna16_marlin.__name__}:moe_wna16_marlin_gemm"
    assert K.repack == f"{gptq_marlin_repack.__name__}:gptq_marlin_repack"
    assert tuple(inspect.signature(moe_wna16_marlin.moe_wna16_marlin_gemm).parameters) == K.gemm_args
    assert tuple(inspect.signature(gptq_marlin_repack.gptq_marlin_repack).parameters) == K.repack_args
    # the JIT sources it compiles, and the loader's failure text validate recognises
    assert all((ROOT / s).is_file() for s in K.sources)
    assert all(Path(s).name in Path(m.__file__).read_text() for s, m in zip(K.sources, (moe_wna16_marlin,
                                                                                       gptq_marlin_repack)))
    ninja = ROOT / "kernels/jit/utils/compile/ninja.py"
    assert f'f"{K.jit.failure_text} ' in ninja.read_text()


def test_the_kernel_wheel_is_sglang_kernel_and_it_holds_the_scalar_types():
    """sglang 0.5.23 requires the distribution sglang-kernel (import name sgl_kernel), whose scalar types the
    Marlin MoE path passes (fused_marlin_moe.py); the table names that distribution, never sgl-kernel."""
    pins = [r for r in requires("sglang") if r.split("==")[0].strip() in ("sglang-kernel", "sgl-kernel")]
    assert pins == ["sglang-kernel==0.4.10"]
    assert K.scalar_dist == "sglang-kernel" and K.scalar_types == "sgl_kernel.scalar_type"
    assert [p.dist for p in ENGINES["sglang"].packages] == ["sglang", "sglang-kernel"]
    src = (ROOT / "srt/layers/moe/fused_moe_triton/fused_marlin_moe.py").read_text()
    assert "from sgl_kernel.scalar_type import scalar_types" in src
    assert "expert_ids_are_sorted=expert_map is None" in src and dict(K.fixed)["expert_ids_are_sorted"] is True


def _fake_nvcc(folder: Path, release: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    archs = " ".join(f"compute_{a}" for a in (75, 80, 86, 89, 90, 100, 120, 121))
    nvcc.write_text(f"#!/bin/sh\ncase \"$1\" in\n  --list-gpu-arch) echo '{archs}' | tr ' ' '\\n';;\n"
                    f"  *) echo 'Cuda compilation tools, release {release}, V{release}.1';;\nesac\n")
    nvcc.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in K.jit.toolkit_env}
    return env | {"PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}"}


CAPS = ((8, 9), (9, 0), (10, 0), (12, 0), (12, 1))


def _sglang_targets(env: dict) -> dict:
    code = ("import json; from sglang.kernels.jit.utils.arch import make_jit_cuda_arch as m; "
            f"print(json.dumps({{f'{{a}}.{{b}}': m(a, b).target_name for a, b in {list(CAPS)!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("release", ["12.8", "13.0"])
def test_doctor_names_the_target_sglangs_jit_compiles_for(tmp_path, release):
    env = _fake_nvcc(tmp_path / "bin", release)
    real = _sglang_targets(env)  # SGLang's own choice, e.g. {"12.0": "12.0f"}
    nvcc = tuple(map(int, release.split(".")))
    assert {c: jit_target(K.jit, tuple(map(int, c.split("."))), nvcc) for c in real} == \
        {c: "sm_" + t.replace(".", "") for c, t in real.items()}
    assert real["12.0"] == ("12.0f" if release == "13.0" else "12.0a") and real["9.0"] == "9.0a"
    proc = subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, env=env)
    data = json.loads(proc.stdout)
    assert data["releases"]["sglang"]["kernels"] == "jit" and data["releases"]["sglang"]["kernel_dist"] == "sglang"
    (jit,) = data["jit"]
    assert jit["toolkit"]["nvcc_version"] == release and jit["toolkit"]["found_by"] == "nvcc on PATH"
    assert jit["toolkit"]["cuda_home"] == str((tmp_path).resolve()) and 120 in jit["toolkit"]["nvcc_archs"]
    assert all(jit["sources"].values()) and jit["needs"]["tvm_ffi"]
    # no GPU here: doctor names what the JIT would compile for Hopper and for sm_120 with this compiler
    assert {t["sm"]: t["target"] for t in jit["targets"]} == {90: "sm_90a", 120: "sm_" + real["12.0"].replace(".", "")}
    assert proc.returncode == 1  # no GPU: this machine cannot serve


@pytest.mark.slow
def test_doctor_fails_clearly_where_sglang_could_not_build_its_kernel(tmp_path):
    """No nvcc where SGLang's JIT looks ($CUDA_HOME names an empty folder) and no sgl_kernel here: findings that
    say what the JIT needs and what to install, never a silent skip."""
    env = {**os.environ, "CUDA_HOME": str(tmp_path / "cuda")}
    data = json.loads(subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, env=env).stdout)
    (jit,) = data["jit"]
    assert jit["toolkit"]["found_by"] == "$CUDA_HOME" and jit["toolkit"]["nvcc"] is None
    text = "\n".join(data["findings"])
    assert f"there is none at {tmp_path / 'cuda'}/bin/nvcc" in text and "install the CUDA toolkit" in text
    if not jit["needs"]["sgl_kernel"]:
        assert "needs sgl_kernel, which is not installed here" in text


@pytest.mark.slow
def test_a_jit_build_that_fails_is_the_typed_kernel_build_error(tmp_path, monkeypatch):
    """SGLang's real op and loader, on this CPU machine: its JIT finds no GPU (target compute_00) and its build
    fails; validate's provider turns that into KernelBuildError with what failed and what to install (validate
    reports it as the kernel.build finding), never a traceback.
    Substitution: the weight type is a stand-in with an `id` (sgl_kernel is not installed in this CPU venv; the
    build fails before SGLang reads it)."""
    import torch

    from dsv4_convert.validate.kernel_provider import KernelBuildError, KernelProvider, _op
    monkeypatch.setenv(K.jit.cache_env, str(tmp_path / "cache"))
    gemm, names = _op(K.gemm)
    provider = KernelProvider("sglang 0.5.23 (JIT)", gemm, names, None, (), type("T", (), {"id": 0})(),
                              dict(K.renames), dict(K.fixed), "act", K)
    i32 = dict(dtype=torch.int32)
    with pytest.raises(KernelBuildError) as e:
        provider.moe_gemm(
            a=torch.zeros(16, 128, dtype=torch.bfloat16), c_or_none=None, b_q_weight=torch.zeros(1, 8, 128, **i32),
            b_bias_or_none=None, b_scales=torch.zeros(1, 8, 64, dtype=torch.uint8), global_scale=None,
            b_zeros_or_none=None, g_idx_or_none=None, perm_or_none=None, is_ep=False, workspace=torch.zeros(4, **i32), sorted_token_ids=torch.zeros(16, **i32),
            expert_ids=torch.zeros(1, **i32), num_tokens_past_padded=torch.tensor([16], **i32),
            topk_weights=torch.ones(16, 1), moe_block_size=16, top_k=1, mul_topk_weights=False, b_type=provider.fe2m1,
            size_m=16, size_n=64, size_k=128, use_atomic_add=False, use_fp32_reduce=False, is_zp_float=False)
    assert "moe_wna16_marlin.cuh" in e.value.message and "build failed on this machine" in e.value.message
    assert "install a CUDA toolkit" in e.value.hint and "dsv4-convert doctor" in e.value.hint
