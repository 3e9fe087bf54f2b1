"""`--device cpu|cuda[:N]`: where the transforms run. Checked before anything is read or written."""

from __future__ import annotations

import re

from ..core.errors import UsageError

__all__ = ["resolve_device"]


def resolve_device(spec: str | None):
    """'cpu' (default) or 'cuda' / 'cuda:N' -> torch.device; UsageError (exit 2) when no usable GPU."""
    import torch
    spec = (spec or "cpu").strip().lower()
    if spec == "cpu":
        return torch.device("cpu")
    m = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if not m:
        raise UsageError(f"--device {spec!r} is not a device; use cpu, cuda or cuda:N", error_id="device.bad_spec")
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise UsageError(f"--device {spec}: {why}", error_id="device.no_gpu",
                         hint="--kernel runs the engine's kernels on the launch GPU: run it there (with a CUDA build "
                              "of torch), or drop --kernel (validate without it needs no GPU); `dsv4-convert doctor` "
                              "shows what this machine has")
    index = int(m.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here",
                         error_id="device.no_gpu", hint="pick an index below the device count (nvidia-smi -L)")
    return torch.device("cuda", index)
