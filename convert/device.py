"""`--device cpu|cuda[:N]`: where the transforms run. Checked before anything is read or written."""

from __future__ import annotations

import re

from dsv4_convert.core.errors import UsageError

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
                         hint="run on the GPU machine, install a CUDA build of torch, or leave --device at cpu "
                              "(same bytes, slower); `dsv4-convert doctor` shows what this machine has")
    index = int(m.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here",
                         error_id="device.no_gpu", hint="pick an index below the device count (nvidia-smi -L)")
    return torch.device("cuda", index)


_TRANSFORM_DEVICE = None  # set by the converter CLI for --device; the transforms run in this process


def set_transform_device(dev) -> None:
    global _TRANSFORM_DEVICE
    _TRANSFORM_DEVICE = None if dev is None or dev.type == "cpu" else dev


def transform_device():
    return _TRANSFORM_DEVICE


def convert_projection_on(dev, p, weight, scale, global_scale, *, target, sf: float = 1.0) -> dict:
    """transform.convert_projection with the weight and scale transforms on `dev` (formats/marlin_torch.py,
    byte-identical); host -> device -> host transfers included, results back on the CPU."""
    from dsv4_convert.core.tensor_model import Quant
    from dsv4_convert.formats.marlin_scales import nvfp4_global_to_marlin
    from dsv4_convert.formats.marlin_torch import mxfp4_to_marlin_t, nvfp4_to_marlin_t
    w, s = weight.to(dev, non_blocking=True), scale.to(dev, non_blocking=True)
    if p.quant is Quant.NVFP4:
        q, ms = nvfp4_to_marlin_t(w, s, target=target, sf=sf)
        g = global_scale.float().reshape(())
        processed = nvfp4_global_to_marlin(g, engine=target.engine, act_dtype=target.act_dtype, sf=sf)
        return {"weight": q.cpu(), "weight_scale": ms.cpu(), "weight_global_scale": processed, "weight_scale_2": g}
    q, ms = mxfp4_to_marlin_t(w, s, target=target)
    return {"weight": q.cpu(), "weight_scale": ms.cpu()}
