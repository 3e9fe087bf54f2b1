"""The MTP (draft) layers of a checkpoint, by name and config: the one place that tells them apart.

The releases keep their draft layers in three ways (synth/mtp.py has the sources):
- under `mtp.`: DeepSeek-V4 `mtp.0.*`, Qwen3.5 / 3.6 and Qwen3-Next `mtp.layers.0.*` (beside the draft's shared
  `mtp.fc`, `mtp.norm`, ...);
- appended after the decoder layers, `<prefix>.layers.<num_hidden_layers + i>.*`: DeepSeek-R1 / V3 (nvidia's FP4
  releases: layer 61, BF16), GLM (in `mtp.safetensors`, outside the index); MiniMax-M2 declares three
  (`num_mtp_modules`) but ships none;
- none (Kimi-K2, Mixtral, Llama-4, Gemma-4).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..checkpoint.index import natural_key
from .structure import model_dims

__all__ = ["copied_mtp_layers", "draft_bytes", "mtp_layers", "num_hidden_layers"]

_APPENDED = re.compile(r"^((?:[\w]+\.)*?layers)\.(\d+)\.")


def num_hidden_layers(config: dict | None) -> int | None:
    """The decoder's layer count (core/sources/structure.py model_dims: a nested `text_config` wins); None where the
    config has none."""
    return model_dims(config or {})["layers"]


def _layer_of(name: str, layers: int | None) -> str | None:
    if name.startswith("mtp"):  # split only these: this runs for every tensor name
        parts = name.split(".")
        if parts[0] == "mtp":
            index = next((i for i, p in enumerate(parts[1:], 1) if p.isdecimal()), None)
            return ".".join(parts[:index + 1]) if index is not None else None
    if layers is None:
        return None
    m = _APPENDED.match(name)
    if m and int(m.group(2)) >= layers:
        return f"{m.group(1)}.{m.group(2)}"
    return None


def mtp_layers(names: Iterable[str], config: dict | None) -> list[str]:
    """The draft layers present: `mtp.0`, `mtp.layers.0`, `model.layers.61`, in natural order."""
    layers = num_hidden_layers(config)
    found = {layer for n in names if (layer := _layer_of(n, layers)) is not None}
    return sorted(found, key=natural_key)


def copied_mtp_layers(names: Iterable[str], config: dict | None, converted: Iterable[str]) -> dict[str, int]:
    """{draft layer: its tensor count} for the draft layers none of whose tensors is a converted FP4 expert
    (`converted`: the converted projections' tensor names): a conversion copies those byte for byte."""
    names, layers = list(names), num_hidden_layers(config)
    return _copied(names, [_layer_of(n, layers) for n in names], converted, layers)


def _copied(names: list[str], of: list[str | None], converted: Iterable[str], layers: int | None) -> dict[str, int]:
    """copied_mtp_layers from each name's draft layer (`of`, in the order of `names`: read once per name)."""
    counts: dict[str, int] = {}
    layer_of = dict(zip(names, of))
    for layer in of:
        if layer is not None:
            counts[layer] = counts.get(layer, 0) + 1
    for n in converted:
        if (layer := layer_of[n] if n in layer_of else _layer_of(n, layers)) is not None:
            counts.pop(layer, None)
    return {layer: counts[layer] for layer in sorted(counts, key=natural_key)}


def draft_bytes(tensors: dict, config: dict | None, converted: Iterable[str]) -> int:
    """Bytes of the copied draft layers (copied_mtp_layers) among `tensors` (name -> ref with nbytes): weights an
    engine loads only for speculative decoding (its main model skips them)."""
    names, layers = list(tensors), num_hidden_layers(config)
    of = [_layer_of(n, layers) for n in names]
    copied = _copied(names, of, converted, layers)
    return sum(ref.nbytes for ref, layer in zip(tensors.values(), of) if layer in copied) if copied else 0
