"""Where `validate --kernel` gets the engine's Marlin kernels: one small interface, a provider per engine
of the engine table (each release's `kernels`, core/targets/kernel_table.py), plus a built module.

  vllm     the installed vLLM's prebuilt ops: torch.ops._moe_C.moe_wna16_marlin_gemm and
           torch.ops._C.gptq_marlin_repack (what vLLM's Marlin MoE `apply` and weight loading call)
  sglang   the installed SGLang's own ops: SGLang 0.5.23 JIT-builds them from its package's CUDA sources on
           first use (sglang.kernels.ops.moe.moe_wna16_marlin, ...quantization.gptq_marlin_repack), exactly as
           its server does; a build that fails (no nvcc, no ninja, an arch the compiler lacks) is a typed
           KernelBuildError, which validate reports as the kernel.build finding
  module   a built Python extension with vLLM's argument order, e.g. the test build of vLLM 0.33.0's or
           0.34.0's kernels (tests/gpu/run.sh builds them): `--kernel-provider module:/path/to/x.so` or
           DSV4_MARLIN_MODULE=/path/to/x.so

The ops are called by name (`KernelProvider.moe_gemm(**kw)`), never by a fixed positional order: the names
are validate's (vLLM's: validate/kernel_moe.py), the release's `renames` map them onto the op's own names
(SGLang says `global_scale_or_none`, `num_tokens_post_padded`, `b_q_type`), its `fixed` supplies what validate
never varies, and the order is the op's own: a torch op's registered schema, a Python op's signature, or for
a pybind module the table's release schema of the module's arity. An argument the op does not take may only
be passed at its "absent" value (None / False / an empty tensor): a W4A8 input is never dropped silently.
A kernel that reads the NVFP4 global in the activation dtype (EngineFacts.global_dtype "act": SGLang) gets it so.

`auto` picks the provider of the layout's engine first, then the others in table order, then a module
named by DSV4_MARLIN_MODULE. Nothing is imported until a provider is chosen, so the CPU-only paths never
touch an engine.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from ..core.targets.engines import ENGINES, LAYOUTS, RELEASES, EngineError, KernelOps, release_for
from ..runtime.settings import MARLIN_MODULE_ENV, settings

__all__ = ["KernelBuildError", "KernelProvider", "providers", "select_provider", "schema_names"]


def _kernels() -> dict[str, str]:
    """--kernel-provider name -> its engine, from the engine table (read at call time)."""
    return {r.kernels.provider: r.engine for r in RELEASES.values()}


def providers() -> tuple[str, ...]:
    """Every --kernel-provider choice: auto, each engine's, module."""
    return ("auto", *_kernels(), "module")


class KernelBuildError(Exception):
    """The engine compiles its kernels on first use, and that build failed here (no toolkit, an arch the
    compiler lacks, a missing build tool): what failed and what to install."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass
class KernelProvider:
    """The engine's two Marlin ops, their argument lists, and how validate's names map onto them."""
    name: str  # "vllm 0.33.0", "sglang 0.5.23 (JIT)", "module /path/x.so"
    gemm: object  # moe_wna16_marlin_gemm
    gemm_args: tuple[str, ...]
    repack_op: object | None  # gptq_marlin_repack
    repack_args: tuple[str, ...]
    fe2m1: object  # the GEMM's weight type for float4_e2m1f: its ScalarType id (int) or the ScalarType
    renames: dict[str, str] = field(default_factory=dict)  # op argument -> validate's name
    fixed: dict[str, object] = field(default_factory=dict)  # op argument -> value validate always passes
    global_dtype: str = "F32"  # "act": the GEMM reads the NVFP4 global in the activation dtype
    ops: KernelOps | None = None  # the release's kernel facts (None: a module)

    def moe_gemm(self, **kw):
        if self.global_dtype == "act" and kw.get("global_scale") is not None:  # exact: the value was rounded so
            kw = {**kw, "global_scale": kw["global_scale"].to(kw["a"].dtype)}
        return self._call(self.gemm, _positional("moe_wna16_marlin_gemm", self.gemm_args, kw, self.renames,
                                                 self.fixed))

    def repack(self, **kw):
        return self._call(self.repack_op, _positional("gptq_marlin_repack", self.repack_args, kw, self.renames,
                                                      self.fixed))

    def _call(self, op, args):
        if self.ops is None or self.ops.jit is None:
            return op(*args)
        try:
            return op(*args)
        except (ImportError, OSError, subprocess.SubprocessError) as e:
            raise _build_error(self, e) from None
        except RuntimeError as e:
            if self.ops.jit.failure_text in str(e):
                raise _build_error(self, e) from None
            raise


def _build_error(p: KernelProvider, e: Exception) -> KernelBuildError:
    jit = p.ops.jit
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    errors = [line for line in lines[1:] if "error" in line.lower()]  # the compiler's own words, where it said any
    tail = " | ".join(lines[:1] + (errors or lines[1:])[-4:])[:1200]
    return KernelBuildError(
        f"{p.name} compiles its Marlin MoE kernel on first use ({', '.join(p.ops.sources)} in the {p.ops.dist} "
        f"package), and that build failed on this machine: {type(e).__name__}: {tail}",
        f"install a CUDA toolkit whose nvcc supports this GPU (found through ${' / $'.join(jit.toolkit_env)}, nvcc "
        f"on PATH or {jit.toolkit_default}) and {', '.join(jit.commands)}, with the Python modules "
        f"{', '.join(jit.python)}; `dsv4-convert doctor` shows what the JIT finds and the target it compiles for")


def _absent(value) -> bool:
    return value is None or value is False or (hasattr(value, "numel") and value.numel() == 0)


def _positional(op: str, schema: tuple[str, ...], kw: dict, renames: dict | None = None,
                fixed: dict | None = None) -> list:
    renames, fixed = renames or {}, fixed or {}
    names = {a: renames.get(a, a) for a in schema}  # op argument -> the caller's name
    missing = [a for a in schema if names[a] not in kw and a not in fixed]
    extra = {k: v for k, v in kw.items() if k not in names.values()}
    if missing or any(not _absent(v) for v in extra.values()):
        raise UsageError(f"{op}: this kernel's schema ({', '.join(schema)}) does not take the call "
                         f"(missing {missing or 'nothing'}, given but not taken "
                         f"{sorted(k for k, v in extra.items() if not _absent(v)) or 'nothing'})",
                         error_id="kernel.schema_unknown",
                         hint="the engine's op schema is not one dsv4-convert knows: add the release to "
                              "core/targets/engines.py (CONTRIBUTING.md, 'Add an engine or an engine version')")
    return [kw[names[a]] if names[a] in kw else fixed[a] for a in schema]


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


def _module_schema(op: str, fn, field: str) -> KernelOps:
    """The kernels of the vLLM release (a module is a build of vLLM's) whose `field` has the function's arity."""
    arity = _doc_arity(fn)
    for r in RELEASES.values():
        if r.kernels.b_type == "id" and len(getattr(r.kernels, field)) == arity:
            return r.kernels
    raise UsageError(f"kernel module's {op} takes {arity} arguments, which no release in core/targets/engines.py has",
                     error_id="kernel.schema_unknown",
                     hint="build the module from a vLLM release the table lists, or add the release")


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _op(path: str):
    """The op at `path`: "torch.ops.<library>.<op>" with its registered schema's names, or "<module>:<function>"
    with its signature's."""
    if path.startswith("torch.ops."):
        import torch
        op = torch.ops
        for part in path.removeprefix("torch.ops.").split("."):
            op = getattr(op, part)
        return op, schema_names(op)
    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name)
    return fn, tuple(inspect.signature(fn).parameters)


def _load_engine(engine: str) -> KernelProvider:
    """The installed release's ops (its kernel facts: core/targets/kernel_table.py). Raises EngineError for a version no
    release covers, ImportError / AttributeError / RuntimeError where the ops cannot be loaded."""
    facts = ENGINES[engine]
    version = _version(facts.packages[0].dist)
    k = release_for(engine, version).kernels
    importlib.import_module(k.module)  # registers the ops / defines the functions; builds nothing
    gemm, gemm_args = _op(k.gemm)
    try:
        repack, repack_args = _op(k.repack)
    except (AttributeError, RuntimeError, ImportError):
        repack, repack_args = None, ()
    fe2m1 = importlib.import_module(k.scalar_types).scalar_types.float4_e2m1f
    name = f"{k.provider} {version}" + (" (JIT)" if k.jit else "")
    return KernelProvider(name, gemm, gemm_args, repack, repack_args, fe2m1.id if k.b_type == "id" else fe2m1,
                          dict(k.renames), dict(k.fixed), facts.global_dtype, k)


def load_module(path: str) -> KernelProvider:
    """A built extension (.so) exposing moe_wna16_marlin_gemm, gptq_marlin_repack and kFE2M1f_id."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"kernel module {path} does not exist", error_id="kernel.provider_missing",
                         hint="check the path, or pick an installed engine's kernels (--kernel-provider "
                              f"{' / '.join(_kernels())}; docs/VALIDATE.md, Providers)")
    import torch  # noqa: F401  (the extension links against torch's libraries)
    name = p.name.split(".")[0]
    try:
        spec = importlib.util.spec_from_file_location(name, p)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (ImportError, OSError) as e:
        raise UsageError(f"kernel module {path} cannot be loaded: {e}", error_id="kernel.provider_broken",
                         hint="rebuild it against this torch (an extension links against the torch it was built "
                              f"with), or pick --kernel-provider {' / '.join(_kernels())}") from None
    missing = [a for a in ("moe_wna16_marlin_gemm", "gptq_marlin_repack", "kFE2M1f_id") if not hasattr(mod, a)]
    if missing:
        raise UsageError(f"kernel module {path} lacks {', '.join(missing)}", error_id="kernel.provider_missing",
                         hint="point at a build of vLLM's Marlin kernels with vLLM's argument order")
    k = _module_schema("moe_wna16_marlin_gemm", mod.moe_wna16_marlin_gemm, "gemm_args")
    repack = _module_schema("gptq_marlin_repack", mod.gptq_marlin_repack, "repack_args")
    return KernelProvider(f"module {p} ({len(k.gemm_args)}-argument GEMM schema)", mod.moe_wna16_marlin_gemm,
                          k.gemm_args, mod.gptq_marlin_repack, repack.repack_args, int(mod.kFE2M1f_id),
                          dict(k.renames), dict(k.fixed))


def _installed(name: str) -> bool:
    return importlib.util.find_spec(ENGINES[_kernels()[name]].packages[0].module) is not None


def _order(layout_tag: str | None) -> list[str]:
    first = LAYOUTS[layout_tag].newest.kernels.provider if layout_tag in LAYOUTS else None
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
            except EngineError:
                if kind != "auto":
                    raise
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
