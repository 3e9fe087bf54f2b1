"""doctor's look at an installed engine release's Marlin kernels, as the engine table says it ships them
(core/targets/kernel_table.py): a prebuilt extension (vLLM: the libraries' SASS for each GPU), or CUDA sources the
engine compiles on first use (SGLang 0.5.23's JIT: the sources, the CUDA toolkit and tools the JIT finds the
way it finds them, the target it compiles for each GPU, and the builds already in its cache). Imports no
engine; runs `nvcc --version` / `--list-gpu-arch` of the toolkit the JIT would use.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..core.targets.engines import KernelOps
from ..core.targets.kernel_table import JitBuild, jit_target
from ..runtime.settings import foreign
from .fatbin import FatbinError, read_cuda_code

__all__ = ["check_library", "engine_kernels", "jit_toolkit", "package_dir"]

_PR = "vLLM #40923: a Marlin MoE build with only PTX for this GPU gave silently wrong output on sm_120"
_NO_GPU = ((9, 0), (12, 0))  # with no GPU visible: the targets for Hopper and for the RTX PRO 6000 (sm_120)


def package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def check_library(d, owner: str, lib: Path) -> dict:
    """One CUDA library's SASS / PTX against every GPU of `d` (findings for PTX-only or no code)."""
    row = {"engine": owner, "library": str(lib)}
    try:
        code = read_cuda_code(lib)
    except (OSError, FatbinError) as e:
        row["error"] = str(e)
        d.extensions.append(row)
        return row
    row.update(sass=sorted(code.sass), ptx=sorted(code.ptx))
    verdicts = []
    for g in d.gpus:
        major, minor = divmod(g["sm"], 10)
        if code.runs_natively(major, minor):
            verdicts.append(f"sm_{g['sm']}: SASS")
        elif code.ptx_for(major, minor):
            verdicts.append(f"sm_{g['sm']}: PTX only")
            d.findings.append(f"{lib.name} ({owner}) has no SASS for sm_{g['sm']} (GPU {g['index']}), only PTX "
                              f"for {sorted(code.ptx)}: {_PR}; install an engine build with sm_{g['sm']} code")
        else:
            verdicts.append(f"sm_{g['sm']}: no code")
            d.findings.append(f"{lib.name} ({owner}) has no code for sm_{g['sm']} (GPU {g['index']}): "
                              f"SASS {sorted(code.sass)}, PTX {sorted(code.ptx)}")
    row["verdict"] = verdicts
    d.extensions.append(row)
    return row


def engine_kernels(d, owner: str, module: str, ops: KernelOps) -> None:
    """The installed release's Marlin kernels: its extension libraries, or its JIT path."""
    root = package_dir(module)
    if ops.jit is None:
        for lib in sorted({p for g in ops.libraries for p in root.glob(g)}) if root else []:
            check_library(d, owner, lib)
        return
    d.jit.append(_jit(d, owner, root, ops))


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def jit_toolkit(jit: JitBuild) -> dict:
    """The CUDA toolkit the JIT uses, found its way: the first of its variables that is set, else the folder
    above `nvcc` on PATH, else its default; the compiler version (`nvcc --version`, else torch's CUDA version, as
    the JIT falls back) and the architectures the compiler can target."""
    named = next((v for v in jit.toolkit_env if foreign(v)), None)  # the first of the JIT's variables that is set
    on_path = shutil.which("nvcc")
    home = foreign(named) if named else (str(Path(on_path).resolve().parent.parent) if on_path else jit.toolkit_default)
    nvcc = Path(home) / "bin" / "nvcc"
    out = _run([str(nvcc), "--version"]) if nvcc.is_file() else None
    m = re.search(r"release (\d+)\.(\d+)", out or "")
    version = (int(m.group(1)), int(m.group(2))) if m else None
    if version is None:  # the JIT's fallback for its target choice (the build itself still needs nvcc)
        import torch
        target_version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    else:
        target_version = version
    archs = sorted({int(a) for a in re.findall(r"compute_(\d+)", _run([str(nvcc), "--list-gpu-arch"]) or "")}) \
        if version else []
    return {"cuda_home": home, "found_by": f"${named}" if named
            else ("nvcc on PATH" if on_path else "default"), "nvcc": str(nvcc) if version else None,
            "nvcc_version": ".".join(map(str, version)) if version else None,
            "target_version": target_version, "nvcc_archs": archs}


def _jit(d, owner: str, root: Path | None, ops: KernelOps) -> dict:
    jit = ops.jit
    tk = jit_toolkit(jit)
    what = f"{owner} compiles its Marlin MoE kernel on first use"
    sources = {s: bool(root and (root / s).is_file()) for s in ops.sources}
    for s, ok in sources.items():
        if not ok:
            d.findings.append(f"{what}, and its source {s} is missing from the {ops.dist} package: reinstall it")
    needs = {m: importlib.util.find_spec(m) is not None for m in (*jit.python, ops.scalar_types.split(".")[0])}
    needs |= {c: shutil.which(c) is not None for c in jit.commands}
    for name, ok in needs.items():
        if not ok:
            d.findings.append(f"{what} and needs {name}, which is not installed here: install it beside {owner}")
    if tk["nvcc"] is None:
        d.findings.append(f"{what} with nvcc, and there is none at {tk['cuda_home']}/bin/nvcc (found by "
                          f"{tk['found_by']}): install the CUDA toolkit or point ${jit.toolkit_env[0]} at it")
    gpus = [(g["index"], divmod(g["sm"], 10)) for g in d.gpus] or [(None, c) for c in _NO_GPU]
    targets = []
    for index, cap in gpus:
        target = jit_target(jit, cap, tk["target_version"])
        row = {"gpu": index, "sm": 10 * cap[0] + cap[1], "target": target}
        if tk["nvcc"] and index is not None and row["sm"] not in tk["nvcc_archs"]:
            d.findings.append(f"{what} for {target} (GPU {index}), and nvcc {tk['nvcc_version']} cannot target "
                              f"sm_{row['sm']}: install a CUDA toolkit that lists compute_{row['sm']} in "
                              "`nvcc --list-gpu-arch`")
        targets.append(row)
    cache = Path(os.path.expanduser(foreign(jit.cache_env) or jit.cache_default))
    built = sorted({p for g in jit.cache_globs for p in cache.glob(g)})
    for lib in built:
        check_library(d, owner, lib)
    return {"engine": owner, "build": "jit", "sources": sources, "needs": needs, "toolkit": tk, "targets": targets,
            "cache": str(cache), "built": [str(p) for p in built]}
