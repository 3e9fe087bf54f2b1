"""Parameter helpers both plugins share. No engine import: the engine's `set_weight_attrs` is passed in."""

from __future__ import annotations

import torch

__all__ = ["same_bytes_loader", "register_param", "register_marlin_params", "w4a8_w13_final"]


def same_bytes_loader(weight_loader):
    """Wrap an engine's expert loader, which copies with `copy_` (a numeric conversion between
    dtypes): a checkpoint tensor is reinterpreted, never converted, to the parameter's dtype when the
    element sizes match (E8M0 scales read as uint8, S0E5M3 bytes stored as float8_e4m3fn)."""

    def load(param, loaded_weight, *args, **kwargs):
        if loaded_weight.dtype != param.dtype and loaded_weight.element_size() == param.element_size():
            loaded_weight = loaded_weight.view(param.dtype)
        if getattr(param, "dsv4_w4a8_rows", False) and loaded_weight.dim() == 2:
            # W4A8 tiles are 32 (K) x 32 (N): a [K/16, 2N] tensor is really [K/32, 4N] with whole
            # N-tiles per column range, so gate/up halves and TP slices are cut in that view
            loaded_weight = loaded_weight.reshape(loaded_weight.shape[0] // 2, -1)
        return weight_loader(param, loaded_weight, *args, **kwargs)

    return load


def register_param(layer, name, data, attrs, weight_loader, set_weight_attrs, **extra):
    param = torch.nn.Parameter(data, requires_grad=False)
    layer.register_parameter(name, param)
    set_weight_attrs(param, {**attrs, **extra, "weight_loader": weight_loader})
    return param


def register_marlin_params(layer, register, *, experts: int, hidden: int, intermediate: int, group: int,
                           scale_dtype: torch.dtype, attrs: dict, loader, scale_attrs: dict,
                           w4a8: bool = False, w13_shards: int = 2) -> None:
    """The four packed expert parameters in their final Marlin shapes (docs/FORMAT.md): weights int32
    [E, K/16, 2N], scales [E, K/g, N], for w13 (N = shards*I, K = H) and w2 (N = H, K = I). `w13_shards`
    is 2 for gated experts (gate | up) and 1 for non-gated ones (Nemotron-H's up_proj alone, the
    engines' `w13_num_shards`). W4A8's w13 is created as [E, H/32, 4*shards*I] (its tile rows;
    `w4a8_w13_final` views it back after loading)."""
    e, h, n13 = experts, hidden, w13_shards * intermediate
    i = intermediate
    if w4a8:
        register(layer, "w13_weight", torch.zeros(e, h // 32, 4 * n13, dtype=torch.int32), attrs, loader,
                 dsv4_w4a8_rows=True)
    else:
        register(layer, "w13_weight", torch.zeros(e, h // 16, 2 * n13, dtype=torch.int32), attrs, loader)
    register(layer, "w2_weight", torch.zeros(e, i // 16, 2 * h, dtype=torch.int32), attrs, loader)
    # zero bytes viewed as the scale dtype (E8M0 has no torch.zeros of its own)
    for name, shape in (("w13_weight_scale", (e, h // group, n13)), ("w2_weight_scale", (e, i // group, h))):
        register(layer, name, torch.zeros(shape, dtype=torch.uint8).view(scale_dtype), attrs, loader, **scale_attrs)


def w4a8_w13_final(w13: torch.Tensor) -> torch.Tensor:
    """[E, H/32, 8I] as loaded -> the kernel's [E, H/16, 4I] (same bytes)."""
    return w13.view(w13.shape[0], w13.shape[1] * 2, w13.shape[2] // 2)
