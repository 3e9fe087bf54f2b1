"""Finalize a conversion's staging directory: everything but the shards. Copies of the other files,
the originals needed for the exact reverse (SOURCE_DIR: configs, index, shard headers, lost scale
bytes), the rewritten configs, the index, SERVING.md and, last, the manifest, each written through the
output tree (runtime/output/), whose publish then renames it to OUT."""

from __future__ import annotations

import json

from ..core.files import (
    CONFIG,
    HF_QUANT_CONFIG,
    INDEX_FILE,
    LOST,
    LOST_SUFFIX,
    SERVING_NOTES,
    SOURCE_DIR,
    SOURCE_HEADERS,
)
from ..core.record.converted_config import ConvertedQuantConfig
from ..core.sources.side_tables import ple_storage
from ..runtime.output import OutputTree
from .plan import ConvertPlan
from .quant_config import rewrite_config, rewrite_hf_quant_config
from .serving_notes import serving_markdown

__all__ = ["finalize"]

def finalize(plan: ConvertPlan, tree: OutputTree, record: ConvertedQuantConfig, *, step=lambda: None) -> int:
    """Write everything but the shards; returns the number of lost (clamped) scale bytes recorded.
    `step` is the converter's crash hook, called between the writes (tests kill the run there)."""
    ckpt = plan.checkpoint
    tree.folder(SOURCE_DIR)
    step()
    for rel in ckpt.other_files:  # tokenizer, generation config, docs: byte-identical copies
        if rel in (CONFIG, HF_QUANT_CONFIG):
            continue
        tree.copy_in(ckpt.root / rel, rel)
    originals = [CONFIG, HF_QUANT_CONFIG] + ([ckpt.index_file] if ckpt.index_file else [])
    for name in originals:
        if (ckpt.root / name).exists():
            tree.copy_in(ckpt.root / name, f"{SOURCE_DIR}/{name}")
    step()
    lost = {}
    sidecars = tree.glob("*" + LOST_SUFFIX)
    if sidecars:  # only the torch route writes them: torch is imported only then
        from safetensors.torch import load_file, save_file
        for f in sidecars:
            lost.update(load_file(f))
            tree.remove(f.name)
        save_file(lost, tree.file(f"{SOURCE_DIR}/{LOST}"))
    tree.write_text(f"{SOURCE_DIR}/{SOURCE_HEADERS}", json.dumps(_source_headers(ckpt), indent=1) + "\n")
    tree.write_text(CONFIG, rewrite_config(ckpt.config, record, ple_storage=ple_storage(ckpt.tensors)))
    if ckpt.hf_quant_config is not None:
        tree.write_text(HF_QUANT_CONFIG, rewrite_hf_quant_config(ckpt.hf_quant_config, record))
    step()
    weight_map = {o.spec.name: s.file for s in plan.shards for o in s.tensors}
    tree.write_json(INDEX_FILE, {"metadata": {"total_size": plan.output_bytes}, "weight_map": weight_map})
    tree.write_text(SERVING_NOTES, serving_markdown(plan, tree.out.name))
    step()
    # the input's content, target and options (plan.fingerprint): a byte-identical copy of the input converts to a
    # byte-identical output; the resume record's fingerprint also stamps the files' inodes and times (tree.open)
    manifest = {**record.manifest_fields(), "fingerprint": plan.fingerprint(), "shards": tree.done}
    tree.write_manifest(manifest)
    step()
    return sum(v.numel() for k, v in lost.items() if k.endswith(".bytes"))


def _source_headers(ckpt) -> dict[str, str]:
    """The exact header bytes of every input shard (as text), so marlin-to-source can rebuild the files."""
    headers = {}
    for file in sorted({t.file for t in ckpt.tensors.values()}):
        with open(ckpt.root / file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            headers[file] = f.read(n).decode("utf-8")
    return headers
