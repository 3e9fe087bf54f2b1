"""`--device cuda[:N]`: the converter's transforms on GPUs (formats/marlin/torch_route.py), byte-identical
to the CPU routes. The devices travel as values: cli/options.py use_device resolves them once per run,
run_conversion's `devices` hands the list to every job with the job's index, and `job_device` picks
the job's GPU from the two (nothing here holds the choice).

How a run uses them (convert/pipeline.py): the shard pieces run in threads of the one process that
holds the CUDA contexts (a forked worker could not use them); job i runs on devices[i % len(devices)]
(`--device cuda` on a machine with N GPUs uses all N; `cuda:N` only that one), and each thread has its
own CUDA stream per device, so one thread's copies back to the host never wait on another thread's
kernels. The plain projections keep the numpy route's reading, checks, scales and globals
(convert/cpu_path.py) and send only the weight repack, the one transform that costs CPU time, to the
GPU; everything else (padded --tp layouts, W4A8, scale defects) takes the torch route on the job's
device. torch is imported only on a GPU run: the CPU route never needs it."""

from __future__ import annotations

import threading

__all__ = ["job_device", "convert_projection_on", "weight_words_on_device", "warm_up"]

_streams = threading.local()  # a cache, not configuration: .by_device {"cuda:N": this thread's stream there}


def job_device(devices: tuple[str, ...], index: int) -> str | None:
    """The GPU ("cuda:N") job `index` of a run on `devices` uses, in turn; None: the CPU (no devices)."""
    return devices[index % len(devices)] if devices else None


def _stream(dev):
    """This thread's CUDA stream on `dev` (made on first use), as a context."""
    import torch
    cache = _streams.__dict__.setdefault("by_device", {})
    key = str(dev)
    if key not in cache:
        cache[key] = torch.cuda.Stream(device=dev)
    return torch.cuda.stream(cache[key])


def warm_up(devices: tuple[str, ...]) -> threading.Thread | None:
    """Create the CUDA context of every device in `devices` in a background thread, so that it overlaps
    the planning instead of delaying the first job (about 1 s). The jobs' first CUDA call waits for it."""
    if not devices:
        return None

    def init():
        import torch
        for d in devices:
            torch.empty(1, device=d)
    t = threading.Thread(target=init, name="dsv4-cuda-init", daemon=True)
    t.start()
    return t


def weight_words_on_device(weight, n: int, k2: int, device: str):
    """uint8 numpy [N, K/2] packed codes -> Marlin W4A16 int32 words as numpy (the bytes of
    formats.marlin.reference_weight.a16_forward), repacked on `device` ("cuda:N") on this thread's stream there."""
    import torch

    from ..formats.marlin.torch_route import to_marlin_weight_t
    with _stream(device):
        w = torch.from_numpy(weight.reshape(n, k2)).to(device, non_blocking=True)
        q = to_marlin_weight_t(w)
        out = torch.empty(q.shape, dtype=q.dtype, pin_memory=True)
        out.copy_(q, non_blocking=True)
        torch.cuda.current_stream().synchronize()
    return out.numpy()


def convert_projection_on(dev, p, weight, scale, global_scale, *, target, sf: float = 1.0) -> dict:
    """transform.convert_projection with the weight and scale transforms on `dev` (formats/marlin/torch_route.py,
    byte-identical); host -> device -> host transfers included, results back on the CPU."""
    from ..core.tensor_model import Quant
    from ..formats.marlin.scales import nvfp4_global_to_marlin
    from ..formats.marlin.torch_route import mxfp4_to_marlin_t, nvfp4_to_marlin_t
    with _stream(dev):
        w, s = weight.to(dev, non_blocking=True), scale.to(dev, non_blocking=True)
        if p.quant is Quant.NVFP4:
            q, ms = nvfp4_to_marlin_t(w, s, target=target, sf=sf)
            g = global_scale.float().reshape(())
            processed = nvfp4_global_to_marlin(g, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
            return {"weight": q.cpu(), "weight_scale": ms.cpu(), "weight_global_scale": processed,
                    "weight_scale_2": g}
        q, ms = mxfp4_to_marlin_t(w, s, target=target)
        return {"weight": q.cpu(), "weight_scale": ms.cpu()}
