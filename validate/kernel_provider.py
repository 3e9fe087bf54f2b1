"""Where `validate --kernel` gets the engine's Marlin kernels: one small interface, a provider per engine
of the engine table (core/engines.py `EngineFacts.kernels`), plus a built module.

  vllm       the installed vLLM's ops: torch.ops._moe_C.moe_wna16_marlin_gemm and
             torch.ops._C.gptq_marlin_repack (what vLLM's Marlin MoE `apply` and weight loading call)
  sgl_kernel SGLang's sgl_kernel ops of the same names (SGLang ported vLLM's Marlin MoE kernels)
  module     a built Python extension with vLLM's argument order, e.g. the test build of vLLM
             0.33.0's or 0.34.0's kernels (tests/gpu/run.sh builds them): `--kernel-provider
             module:/path/to/x.so` or DSV4_MARLIN_MODULE=/path/to/x.so

The ops are called by their schema's argument names (`KernelProvider.moe_gemm(**kw)`), never by a fixed
positional order: vLLM 0.34.0 removed `a_scales` (the MoE GEMM went from 26 to 25 arguments) and
`is_a_8bit` (the repack, 5 to 4). A torch op's names come from its own registered schema; a pybind module
has none, so its schema is the table's release schema with the module's arity. An argument the op does not
take may only be passed at its "absent" value (None / False): a W4A8 input is never dropped silently.

`auto` picks the provider of the layout's engine first, then the others in table order, then a module
named by DSV4_MARLIN_MODULE. Nothing is imported until a provider is chosen, so the CPU-only paths never
touch an engine.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.engines import ENGINES, LAYOUTS, RELEASES, KernelOps
from ..core.errors import UsageError
from ..runtime.settings import MARLIN_MODULE_ENV, settings

__all__ = ["KernelProvider", "providers", "select_provider", "schema_names"]

def _kernels() -> dict[str, KernelOps]:
    """--kernel-provider name -> the engine's ops, from the engine table (read at call time)."""
    return {f.kernels.provider: f.kernels for f in ENGINES.values()}


def providers() -> tuple[str, ...]:
    """Every --kernel-provider choice: auto, each engine's, module."""
    return ("auto", *_kernels(), "module")


@dataclass
class KernelProvider:
    """The engine's two Marlin ops and their schemas (argument names in order)."""
    name: str  # "vllm 0.33.0", "sgl_kernel 0.3.x", "module /path/x.so"
    gemm: object  # moe_wna16_marlin_gemm
    gemm_args: tuple[str, ...]
    repack_op: object | None  # gptq_marlin_repack
    repack_args: tuple[str, ...]
    fe2m1_id: int  # ScalarTypeId of float4_e2m1f weights

    def moe_gemm(self, **kw):
        return self.gemm(*_positional("moe_wna16_marlin_gemm", self.gemm_args, kw))

    def repack(self, **kw):
        return self.repack_op(*_positional("gptq_marlin_repack", self.repack_args, kw))


def _positional(op: str, schema: tuple[str, ...], kw: dict) -> list:
    missing = [a for a in schema if a not in kw]
    extra = {a: v for a, v in kw.items() if a not in schema}
    if missing or any(v is not None and v is not False for v in extra.values()):
        raise UsageError(f"{op}: this kernel's schema ({', '.join(schema)}) does not take the call "
                         f"(missing {missing or 'nothing'}, given but not taken {sorted(extra) or 'nothing'})",
                         error_id="kernel.schema_unknown",
                         hint="the engine's op schema is not one dsv4-convert knows: add the release to "
                              "core/engines.py (CONTRIBUTING.md, 'Add an engine or an engine version')")
    return [kw[a] for a in schema]


def schema_names(op) -> tuple[str, ...]:
    """A torch op's argument names from its registered schema."""
    packet = getattr(op, "default", op)
    return tuple(a.name for a in packet._schema.arguments)


def _doc_arity(fn) -> int:
    """Number of parameters of a pybind11 function, from the signature line pybind writes in __doc__."""
    head = (fn.__doc__ or "").split("\n", 1)[0]
    m = re.match(r"[\w.]+\((.*)\)\s*->", head)
    if not m:
        return -1
    depth, count = 0, 1 if m.group(1).strip() else 0
    for ch in m.group(1):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count


def _module_schema(op: str, fn, field: str) -> tuple[str, ...]:
    """The table's schema (of any release) with the module function's arity."""
    arity = _doc_arity(fn)
    for r in RELEASES.values():
        if len(getattr(r, field)) == arity:
            return getattr(r, field)
    raise UsageError(f"kernel module's {op} takes {arity} arguments, which no release in core/engines.py has",
                     error_id="kernel.schema_unknown",
                     hint="build the module from a vLLM release the table lists, or add the release")


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _torch_op(path: str):
    import torch
    op = torch.ops
    for part in path.split("."):
        op = getattr(op, part)
    return op


def _load_engine(k: KernelOps) -> KernelProvider:
    importlib.import_module(k.module)  # registers the ops
    gemm = _torch_op(k.gemm)
    try:
        repack = _torch_op(k.repack)
    except (AttributeError, RuntimeError):
        repack = None
    fe2m1 = importlib.import_module(k.scalar_types).scalar_types.float4_e2m1f.id
    return KernelProvider(f"{k.provider} {_version(k.dist)}", gemm, schema_names(gemm), repack,
                          schema_names(repack) if repack is not None else (), fe2m1)


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
    gemm_args = _module_schema("moe_wna16_marlin_gemm", mod.moe_wna16_marlin_gemm, "gemm_args")
    repack_args = _module_schema("gptq_marlin_repack", mod.gptq_marlin_repack, "repack_args")
    return KernelProvider(f"module {p} ({len(gemm_args)}-argument GEMM schema)", mod.moe_wna16_marlin_gemm,
                          gemm_args, mod.gptq_marlin_repack, repack_args, int(mod.kFE2M1f_id))


def _installed(name: str) -> bool:
    return importlib.util.find_spec(_kernels()[name].module.split(".")[0]) is not None


def _order(layout_tag: str | None) -> list[str]:
    first = LAYOUTS[layout_tag].kernels.provider if layout_tag in LAYOUTS else None
    return ([first] if first else []) + [n for n in _kernels() if n != first]


def select_provider(choice: str, layout_tag: str | None) -> KernelProvider:
    """`choice` is auto, a provider of the engine table, module or module:PATH. Raises UsageError (exit 2)
    naming what was looked for when nothing usable is there."""
    kind, _, path = choice.partition(":")
    if kind not in providers():
        raise UsageError(f"unknown kernel provider {choice!r}; choose one of {', '.join(providers())} or module:PATH",
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
                return _load_engine(_kernels()[name])
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
