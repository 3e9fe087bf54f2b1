"""`--device cuda[:N]`: the converter's transforms on GPUs (formats/marlin_torch.py), byte-identical
to the CPU routes. The devices are chosen once per run by the converter CLI.

How a run uses them (convert/pipeline.py): the shard pieces run in threads of the one process that
holds the CUDA context (a forked worker could not use it); each thread takes the next device in
turn (`--device cuda` on a machine with N GPUs uses all N; `cuda:N` only that one) and its own CUDA
stream, so one thread's copies back to the host never wait on another thread's kernels. The
plain projections keep the numpy route's reading, checks, scales and globals (convert/cpu_path.py)
and send only the weight repack, the one transform that costs CPU time, to the GPU; everything
else (padded --tp layouts, W4A8, scale defects) takes the torch route on the thread's device.
This module imports torch only once a device is set: the CPU route never needs it."""

from __future__ import annotations

import itertools
import threading

__all__ = ["set_transform_device", "on_gpu", "transform_device", "convert_projection_on", "weight_words_on_device",
           "warm_up"]

_DEVICES: list = []  # set by the converter CLI for --device; empty: the transforms run on the CPU
_local = threading.local()  # per job thread: .device, .stream
_turn = itertools.count()  # the next thread takes device next(_turn) % len(_DEVICES)


def set_transform_device(dev) -> None:
    """`dev`: None or a cpu device (CPU route), a CUDA torch.device, or a list of them (one per GPU)."""
    global _DEVICES, _turn
    devs = dev if isinstance(dev, (list, tuple)) else [dev]
    _DEVICES = [d for d in devs if d is not None and d.type != "cpu"]
    _turn = itertools.count()
    _local.__dict__.clear()


def on_gpu() -> bool:
    """Whether --device chose GPUs for this run (without assigning this thread one)."""
    return bool(_DEVICES)


def transform_device():
    """This thread's device (assigned on first use, in turn), or None on the CPU route."""
    if not _DEVICES:
        return None
    dev = getattr(_local, "device", None)
    if dev is None or dev not in _DEVICES:
        dev = _local.device = _DEVICES[next(_turn) % len(_DEVICES)]
        _local.stream = None
    return dev


def _stream():
    """This thread's CUDA stream on its device (made on first use)."""
    import torch
    dev = transform_device()
    if getattr(_local, "stream", None) is None:
        _local.stream = torch.cuda.Stream(device=dev)
    return torch.cuda.stream(_local.stream)


def warm_up() -> threading.Thread | None:
    """Create the CUDA context of every device in a background thread, so that it overlaps the
    planning instead of delaying the first job (about 1 s). The jobs' first CUDA call waits for it."""
    if not _DEVICES:
        return None
    devices = list(_DEVICES)

    def init():
        import torch
        for d in devices:
            torch.empty(1, device=d)
    t = threading.Thread(target=init, name="dsv4-cuda-init", daemon=True)
    t.start()
    return t


def weight_words_on_device(weight, n: int, k2: int):
    """uint8 numpy [N, K/2] packed codes -> Marlin W4A16 int32 words as numpy (the bytes of
    formats.marlin_words.a16_forward), repacked on this thread's device."""
    import torch

    from dsv4_convert.formats.marlin_torch import to_marlin_weight_t
    with _stream():
        w = torch.from_numpy(weight.reshape(n, k2)).to(transform_device(), non_blocking=True)
        q = to_marlin_weight_t(w)
        out = torch.empty(q.shape, dtype=q.dtype, pin_memory=True)
        out.copy_(q, non_blocking=True)
        torch.cuda.current_stream().synchronize()
    return out.numpy()


def convert_projection_on(dev, p, weight, scale, global_scale, *, target, sf: float = 1.0) -> dict:
    """transform.convert_projection with the weight and scale transforms on `dev` (formats/marlin_torch.py,
    byte-identical); host -> device -> host transfers included, results back on the CPU."""
    from dsv4_convert.core.tensor_model import Quant
    from dsv4_convert.formats.marlin_scales import nvfp4_global_to_marlin
    from dsv4_convert.formats.marlin_torch import mxfp4_to_marlin_t, nvfp4_to_marlin_t
    with _stream():
        w, s = weight.to(dev, non_blocking=True), scale.to(dev, non_blocking=True)
        if p.quant is Quant.NVFP4:
            q, ms = nvfp4_to_marlin_t(w, s, target=target, sf=sf)
            g = global_scale.float().reshape(())
            processed = nvfp4_global_to_marlin(g, engine=target.engine, act_dtype=target.act_dtype, sf=sf)
            return {"weight": q.cpu(), "weight_scale": ms.cpu(), "weight_global_scale": processed,
                    "weight_scale_2": g}
        q, ms = mxfp4_to_marlin_t(w, s, target=target)
        return {"weight": q.cpu(), "weight_scale": ms.cpu()}
