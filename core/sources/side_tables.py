"""The parts of a checkpoint besides its layers' weights that the engines place apart when serving, by name: one
home for `plan` (per-GPU memory) and `inspect`.

- DeepSeek-V4.1's Engram tables `layers.L.engram.embed.{weight,scale}` (F8_E4M3 rows with 1x32 E8M0 scales; about
  189 GiB of the release's 475 GiB): vLLM keeps them in pinned host memory by default, SGLang shards them over the
  GPUs unless told otherwise (core/targets/engines.py EngramHost). The layer's other Engram weights (`engram.wkv`,
  `q_weight`, `k_weight`) are ordinary TP-sharded or replicated weights.
- DeepSeek-V4.1's vision tower `vision.*`, `aligner.*` and `image_{start,end,newline}` (BF16): counted whole on
  every GPU (vLLM may run the ViT data-parallel, replicated per rank: models/deepseek_v4/common/vision.py
  is_vit_use_data_parallel), an upper bound.
Both are copied byte for byte by the converter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["engram_table_bytes", "is_engram_table", "is_vision", "vision_bytes"]

_ENGRAM_TABLE = re.compile(r"(?:^|\.)layers\.\d+\.engram\.embed\.")
_VISION_PREFIXES = ("vision.", "aligner.", "image_start", "image_end", "image_newline")


def is_engram_table(name: str) -> bool:
    return _ENGRAM_TABLE.search(name) is not None


def is_vision(name: str) -> bool:
    return name.startswith(_VISION_PREFIXES)


def engram_table_bytes(tensors: Mapping) -> int:
    """Bytes of the Engram tables among `tensors` (name -> ref with nbytes)."""
    return sum(ref.nbytes for name, ref in tensors.items() if is_engram_table(name))


def vision_bytes(tensors: Mapping) -> int:
    return sum(ref.nbytes for name, ref in tensors.items() if is_vision(name))
