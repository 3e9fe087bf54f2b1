"""Where `validate --kernel` gets the engine's Marlin kernels: one small interface, three providers.

  vllm       the installed vLLM's ops: torch.ops._moe_C.moe_wna16_marlin_gemm and
             torch.ops._C.gptq_marlin_repack (what vLLM's Marlin MoE `apply` and weight loading call)
  sgl_kernel SGLang's sgl_kernel ops of the same names (SGLang ported vLLM's Marlin MoE kernels)
  module     a built Python extension with vLLM's argument order, e.g. the test build of vLLM
             0.33.0's kernels (tests/gpu/run.sh builds one): `--kernel-provider module:/path/to/x.so`
             or DSV4_MARLIN_MODULE=/path/to/x.so

`auto` picks the engine of the layout (vllm for `vllm-L4`, sgl_kernel then vllm for `sglang-L2`),
then a module named by DSV4_MARLIN_MODULE. Nothing is imported until a provider is chosen, so the
CPU-only paths never touch an engine.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from dsv4_convert.core.errors import UsageError
from dsv4_convert.runtime.settings import MARLIN_MODULE_ENV, settings

__all__ = ["KernelProvider", "PROVIDERS", "select_provider"]

PROVIDERS = ("auto", "vllm", "sgl_kernel", "module")


@dataclass
class KernelProvider:
    """The engine's two Marlin ops, with vLLM 0.33.0's positional argument order."""
    name: str  # "vllm 0.33.0", "sgl_kernel 0.3.x", "module /path/x.so"
    moe_gemm: object  # moe_wna16_marlin_gemm(a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, ...)
    repack: object | None  # gptq_marlin_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit)
    fe2m1_id: int  # ScalarTypeId of float4_e2m1f weights


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _vllm() -> KernelProvider:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads _C and _moe_C, which register the ops)
    from vllm.scalar_type import scalar_types
    return KernelProvider(f"vllm {_version('vllm')}", torch.ops._moe_C.moe_wna16_marlin_gemm,
                          torch.ops._C.gptq_marlin_repack, scalar_types.float4_e2m1f.id)


def _sgl_kernel() -> KernelProvider:
    import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
    import torch
    from sgl_kernel.scalar_type import scalar_types
    ops = torch.ops.sgl_kernel
    repack = getattr(ops, "gptq_marlin_repack", None)
    return KernelProvider(f"sgl_kernel {_version('sgl-kernel')}", ops.moe_wna16_marlin_gemm, repack,
                          scalar_types.float4_e2m1f.id)


def load_module(path: str) -> KernelProvider:
    """A built extension (.so) exposing moe_wna16_marlin_gemm, gptq_marlin_repack and kFE2M1f_id."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"kernel module {path} does not exist", error_id="kernel.provider_missing",
                         hint="check the path, or pick --kernel-provider vllm / sgl_kernel (an installed engine's "
                              "kernels; docs/VALIDATE.md, Providers)")
    import torch  # noqa: F401  (the extension links against torch's libraries)
    name = p.name.split(".")[0]
    try:
        spec = importlib.util.spec_from_file_location(name, p)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (ImportError, OSError) as e:
        raise UsageError(f"kernel module {path} cannot be loaded: {e}", error_id="kernel.provider_broken",
                         hint="rebuild it against this torch (an extension links against the torch it was built "
                              "with), or pick --kernel-provider vllm / sgl_kernel") from None
    missing = [a for a in ("moe_wna16_marlin_gemm", "gptq_marlin_repack", "kFE2M1f_id") if not hasattr(mod, a)]
    if missing:
        raise UsageError(f"kernel module {path} lacks {', '.join(missing)}", error_id="kernel.provider_missing",
                         hint="point at a build of vLLM's Marlin kernels with vLLM's argument order")
    return KernelProvider(f"module {p}", mod.moe_wna16_marlin_gemm, mod.gptq_marlin_repack, int(mod.kFE2M1f_id))


_LOADERS = {"vllm": ("vllm", _vllm), "sgl_kernel": ("sgl_kernel", _sgl_kernel)}


def _installed(name: str) -> bool:
    return importlib.util.find_spec(_LOADERS[name][0]) is not None


def _order(layout_tag: str | None) -> list[str]:
    return ["sgl_kernel", "vllm"] if layout_tag == "sglang-L2" else ["vllm", "sgl_kernel"]


def select_provider(choice: str, layout_tag: str | None) -> KernelProvider:
    """`choice` is auto, vllm, sgl_kernel, module or module:PATH. Raises UsageError (exit 2) naming
    what was looked for when nothing usable is there."""
    kind, _, path = choice.partition(":")
    if kind not in PROVIDERS:
        raise UsageError(f"unknown kernel provider {choice!r}; choose one of {', '.join(PROVIDERS)} or module:PATH",
                         error_id="kernel.provider_unknown")
    if kind == "module":
        path = path or settings().marlin_module
        if not path:
            raise UsageError("--kernel-provider module needs a path (module:PATH or DSV4_MARLIN_MODULE)",
                             error_id="kernel.provider_missing")
        return load_module(path)
    names = _order(layout_tag) if kind == "auto" else [kind]
    for name in names:
        if _installed(name):
            try:
                return _LOADERS[name][1]()
            except (ImportError, AttributeError, RuntimeError) as e:
                if kind != "auto":
                    raise UsageError(f"{name} is installed but its Marlin MoE op cannot be loaded: {e}",
                                     error_id="kernel.provider_broken",
                                     hint="check that the engine build matches this torch and CUDA "
                                          "(dsv4-convert doctor)") from None
    if kind == "auto" and settings().marlin_module:
        return load_module(settings().marlin_module)
    looked = ", ".join(names) + (f", ${MARLIN_MODULE_ENV}" if kind == "auto" else "")
    raise UsageError(f"no Marlin kernel provider found (looked for {looked})", error_id="kernel.provider_missing",
                     hint="install the engine you will serve with (vLLM or SGLang) on this machine, or pass "
                          "--kernel-provider module:PATH to a built extension")
