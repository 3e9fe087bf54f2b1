"""The `validate --kernel` options, checked before any work starts (a missing GPU is exit 2)."""

from __future__ import annotations

import click

from ..runtime.device import resolve_device
from ..validate.kernel_runner import KernelOptions, run_kernel_checks
from ..validate.kernel_shapes import refuse_unsupported_shapes

__all__ = ["kernel_options", "refuse_unsupported_shapes", "run_kernel_checks"]


def kernel_options(kernel: bool, experts: str, provider: str, device: str | None) -> KernelOptions | None:
    if not kernel:
        if device is not None:
            raise click.BadParameter("--device only applies with --kernel here", param_hint="--device")
        return None
    if experts != "all" and not (experts.isdigit() and int(experts) > 0):
        raise click.BadParameter(f"must be a positive number or 'all', got {experts!r}", param_hint="--kernel-experts")
    dev = resolve_device(device or "cuda")
    if dev.type != "cuda":
        raise click.BadParameter("--kernel runs the engine's CUDA kernels: use --device cuda[:N]", param_hint="--device")
    return KernelOptions(provider=provider, experts=None if experts == "all" else int(experts), device=str(dev))
