"""The parts of a checkpoint besides its layers' weights that the engines place apart when serving, by name: one
home for `plan` (per-GPU memory) and `inspect`.

- DeepSeek-V4.1's Engram tables `layers.L.engram.embed.{weight,scale}` (F8_E4M3 rows with 1x32 E8M0 scales; about
  189 GiB of the release's 475 GiB): vLLM keeps them in pinned host memory by default, SGLang shards them over the
  GPUs unless told otherwise (core/targets/engines.py EngramHost). The layer's other Engram weights (`engram.wkv`,
  `q_weight`, `k_weight`) are ordinary TP-sharded or replicated weights.
- DeepSeek-V4.1's vision tower `vision.*`, `aligner.*` and `image_{start,end,newline}` (BF16): counted whole on
  every GPU (vLLM may run the ViT data-parallel, replicated per rank: models/deepseek_v4/common/vision.py
  is_vit_use_data_parallel), an upper bound.
- Qwen3.8-Flash-Next's (Qwen4-Exp) per-layer n-gram embedding (PLE) tables
  `layers.L.ple.ple_embedding.ngram_embedding.shard_<i>.{weight,weight_scale}` (BF16, FP8 with one table scale, or
  NVFP4 rows: packed E2M1 `weight`, E4M3 block `weight_scale`, one `weight_scale_2`): no experts, whatever their
  dtype. Both engines pick the table's storage from the quantisation config's class (vLLM 0.34 vllm/models/qwen4_exp/
  common/ngram_embedding.py Qwen4ExpPLEEmbeddingMethod.from_quant_config: ModelOpt MIXED_PRECISION -> FP8 or NVFP4,
  any other config -> "Falling back to unquantized PLE embedding"; SGLang 0.5.23 models/qwen4_exp.py
  _ple_table_is_fp8) unless config.json's text config says it, `ple_embedding_dtype` ("nvfp4" or "float8_e4m3fn");
  the plugins' `marlin_fp4` config is not the engine's ModelOpt class, so a conversion says it there
  (`ple_storage`: what the tables hold on disk).
All of them are copied byte for byte by the converter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["engram_table_bytes", "is_engram_table", "is_ple_table", "is_vision", "ple_storage", "vision_bytes"]

_ENGRAM_TABLE = re.compile(r"(?:^|\.)layers\.\d+\.engram\.embed\.")
_PLE_TABLE = re.compile(r"(?:^|\.)layers\.\d+\.ple\.ple_embedding\.ngram_embedding\.shard_\d+\.weight$")
# a PLE table's on-disk row dtype -> the engines' `ple_embedding_dtype` for it (BF16 rows need none)
_PLE_STORAGE = {"F8_E4M3": "float8_e4m3fn", "U8": "nvfp4"}
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


def is_ple_table(name: str) -> bool:
    """A row shard of a Qwen4-Exp PLE n-gram table (its `weight`; NVFP4 tables also have a shard `weight_scale`)."""
    return _PLE_TABLE.search(name) is not None


def ple_storage(tensors: Mapping) -> str | None:
    """The `ple_embedding_dtype` the engines need told for the PLE tables among `tensors` (name -> ref with dtype):
    "float8_e4m3fn", "nvfp4", or None (no table, or BF16 rows). Tables of two storages in one checkpoint: None (both
    engines take one storage for every table; validate and the proof see such a checkpoint as it is)."""
    kinds = {_PLE_STORAGE.get(ref.dtype) for name, ref in tensors.items() if is_ple_table(name)}
    return kinds.pop() if len(kinds) == 1 else None
