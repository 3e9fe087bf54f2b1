"""`--device cuda[:N]`: the converter's transforms on a GPU (formats/marlin_torch.py), byte-identical
to the CPU routes. The device travels as a job argument (convert/pipeline.py run_conversion's `device`)."""

from __future__ import annotations

__all__ = ["convert_projection_on"]


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
        processed = nvfp4_global_to_marlin(g, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
        return {"weight": q.cpu(), "weight_scale": ms.cpu(), "weight_global_scale": processed, "weight_scale_2": g}
    q, ms = mxfp4_to_marlin_t(w, s, target=target)
    return {"weight": q.cpu(), "weight_scale": ms.cpu()}
