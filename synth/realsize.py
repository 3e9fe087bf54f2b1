"""Real-size mode of `synth`: ONE DeepSeek-V4-Flash MoE layer (256 experts, hidden 4096, intermediate
2048; about 3.4 GB MXFP4, 3.6 GB NVFP4) with only the routed-expert tensors and the output head, for
benchmarks.

The data is RANDOM CODES, not quantized matrices: packed bytes are uniform (every nibble is a valid
E2M1 code), E8M0 scale bytes are uniform in 118..130 (2**-9 .. 2**3), E4M3 block scales are uniform
bytes 0x30..0x57 (0.5 .. 15), NVFP4 globals ~2**-9. Quantizing 768 matrices of 2048x4096 would take
minutes; this takes seconds and is just as good for measuring repack speed. Tensors are produced
one at a time, so the caller can hold a single shard in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch

from ..core.checkpoint.dtypes import DTYPES
from ..core.checkpoint.tensor_model import Quant
from ..core.sources.source_formats import source_format
from .experts import ROLES, expert_slot, layer_format
from .layouts import Dims

__all__ = ["REAL_SIZE", "real_size_plan"]

REAL_SIZE = Dims(layers=1, experts=256, hidden=4096, intermediate=2048, hash_layers=0, mtp=False)

_E8M0_RANGE = (118, 131)
_E4M3_RANGE = (0x30, 0x58)


def _rng(seed: int, key: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/real/{key}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def _bytes(seed: int, key: str, shape: tuple[int, ...], low: int = 0, high: int = 256) -> torch.Tensor:
    rng = _rng(seed, key)
    if (low, high) == (0, 256):  # uniform bytes: draw 64-bit words, about twice as fast
        n = int(np.prod(shape, dtype=np.int64))
        words = rng.integers(0, 2**64, size=-(-n // 8), dtype=np.uint64)
        return torch.from_numpy(words.view(np.uint8)[:n].reshape(shape))
    return torch.from_numpy(rng.integers(low, high, size=shape, dtype=np.uint8))


def _scalar(seed: int, key: str, low: float, high: float) -> float:
    return float(np.float32(_rng(seed, key).uniform(low, high)))


def _dsv4_or_hf_specs(fmt: str, d: Dims) -> dict[str, tuple]:
    """name -> (kind, shape, torch dtype, value key) for every expert tensor of the d.layers MoE layers
    (benchmarks ask for several), in file order. Layer 0's names and bytes do not depend on d.layers."""
    specs: dict[str, tuple] = {}
    row = layer_format(fmt, "0")
    nvfp4 = row.trunk is Quant.NVFP4
    ds = source_format(fmt).synth.tree == "deepseek-v4"
    codes, scales = (getattr(torch, DTYPES[t][1]) for t in (row.weight_dtype, row.scale_dtype))
    group = row.block_size
    for layer in range(d.layers):
        at = f"{layer}/" if layer else ""  # a layer's globals and input scales: its own values
        for e in range(d.experts):
            for role in ("gate", "down", "up") if ds else ROLES:
                n, k = (d.hidden, d.intermediate) if role == "down" else (d.intermediate, d.hidden)
                slot = expert_slot(fmt, str(layer), e, role)
                fused = f"{at}{e}/{'down' if role == 'down' else 'w13'}"
                specs[slot.weight] = ("codes", (n, k // 2), codes, None)
                if nvfp4:
                    specs[slot.scale] = ("e4m3", (n, k // group), scales, None)
                    shape = (1,) if row.global_rule.reciprocal else ()
                    specs[slot.global_scale] = ("global", shape, torch.float32, fused)
                    specs[slot.input_scale] = ("input", shape, torch.float32, fused)
                else:
                    specs[slot.scale] = ("e8m0", (n, k // group), scales, None)
    return specs


def _gptoss_specs(d: Dims) -> dict[str, tuple]:
    e, h, i = d.experts, d.hidden, d.intermediate
    base = "model.layers.0.mlp.experts."
    return {
        base + "gate_up_proj_blocks": ("codes", (e, 2 * i, h // 32, 16), torch.uint8, None),
        base + "gate_up_proj_scales": ("e8m0", (e, 2 * i, h // 32), torch.uint8, None),
        base + "gate_up_proj_bias": ("bias", (e, 2 * i), None, None),
        base + "down_proj_blocks": ("codes", (e, h, i // 32, 16), torch.uint8, None),
        base + "down_proj_scales": ("e8m0", (e, h, i // 32), torch.uint8, None),
        base + "down_proj_bias": ("bias", (e, h), None, None),
    }


def _make(seed: int, name: str, spec: tuple, dtype: torch.dtype) -> torch.Tensor:
    kind, shape, tdtype, key = spec
    if kind == "codes":
        return _bytes(seed, name, shape).view(tdtype)
    if kind == "e8m0":
        return _bytes(seed, name, shape, *_E8M0_RANGE).view(tdtype)
    if kind == "e4m3":
        return _bytes(seed, name, shape, *_E4M3_RANGE).view(tdtype)
    if kind in ("bias", "dense"):  # small random values in the model's dtype
        g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:7],
                                                         "little"))
        return (torch.randn(shape, generator=g) * 0.01).to(dtype)
    value = _scalar(seed, f"{kind}/{key}", 2.0**-10, 2.0**-8)  # ModelOpt multiplier: shared by w1 and w3
    if shape == (1,):  # compressed-tensors stores the reciprocal
        return torch.tensor([1.0 / value], dtype=torch.float32)
    return torch.tensor(value, dtype=torch.float32)


def real_size_plan(fmt: str, seed: int, dims: Dims = REAL_SIZE, dtype: torch.dtype = torch.bfloat16
                   ) -> tuple[list[str], list[int], Callable[[str], torch.Tensor]]:
    """(tensor names in file order, their byte sizes, a function that makes one tensor by name)."""
    tree = source_format(fmt).synth.tree
    specs = _gptoss_specs(dims) if tree == "gpt-oss" else _dsv4_or_hf_specs(fmt, dims)
    # the model's own output head, last (4 MB): the structure rules require it of every untied model
    # (core/sources/structure.py: DeepSeek-V4's `head.weight`, the others' `lm_head.weight`)
    specs["head.weight" if tree == "deepseek-v4" else "lm_head.weight"] = ("dense", (dims.vocab, dims.hidden), None, None)
    elem = {torch.float32: 4, None: dtype.itemsize}
    sizes = [int(np.prod(s[1], dtype=np.int64)) * elem.get(s[2], 1) for s in specs.values()]
    return list(specs), sizes, lambda name: _make(seed, name, specs[name], dtype)
