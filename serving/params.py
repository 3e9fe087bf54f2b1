"""Parameter helpers both plugins share. No engine import: the engine's `set_weight_attrs` is passed in."""

from __future__ import annotations

import torch

__all__ = ["same_bytes_loader", "register_param"]


def same_bytes_loader(weight_loader):
    """Wrap an engine's expert loader, which copies with `copy_` (a numeric conversion between
    dtypes): a checkpoint tensor is reinterpreted, never converted, to the parameter's dtype when the
    element sizes match (E8M0 scales read as uint8, S0E5M3 bytes stored as float8_e4m3fn)."""

    def load(param, loaded_weight, *args, **kwargs):
        if loaded_weight.dtype != param.dtype and loaded_weight.element_size() == param.element_size():
            loaded_weight = loaded_weight.view(param.dtype)
        return weight_loader(param, loaded_weight, *args, **kwargs)

    return load


def register_param(layer, name, data, attrs, weight_loader, set_weight_attrs, **extra):
    param = torch.nn.Parameter(data, requires_grad=False)
    layer.register_parameter(name, param)
    set_weight_attrs(param, {**attrs, **extra, "weight_loader": weight_loader})
    return param
