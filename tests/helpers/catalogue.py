"""The corrupt-input catalogue: one entry per way a checkpoint can be damaged, each with the command
that must refuse it, the stable error id and exit code it must give, and what `validate` reports.

Each `build` takes a writable copy of a small synth checkpoint and damages it in one place (helpers in
corrupt.py). docs/ERRORS.md lists the same entries; test_catalogue.py runs them through the real CLI.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4_convert.core.errors import ContentError, InputError
from dsv4_convert.core.files import SYNTH_MANIFEST
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.corrupt import (
    INDEX,
    add_tensor,
    drop_tensors,
    edit_header,
    edit_json,
    poke_tensor_bytes,
    read_shard,
    shard_of,
    write_shard,
)

__all__ = ["CATALOGUE", "CONFIG_FINDINGS", "EXPERT", "MX", "NV", "NV_HF", "VALUE_FINDINGS", "Entry"]

NV, MX, NV_HF = "nvfp4-modelopt-dsv4", "mxfp4-dsv4", "nvfp4-modelopt-hf"
EXPERT = "layers.0.ffn.experts.1"  # DeepSeek names (NV, MX): w1 gate, w3 up, w2 down
INPUT, CONTENT = InputError.exit_code, ContentError.exit_code


@dataclass(frozen=True)
class Entry:
    """`error_id`/`code`: what the converter and `inspect` give. `validate`: the check id that
    `validate` reports as a finding (exit 1), or None when validate refuses the input as unreadable
    (exit 2, with `error_id` on stderr). `inspect_ok`: inspect reads only headers and succeeds
    (value defects). `names`: a string the message must contain (the file or the tensor)."""
    name: str
    fmt: str
    build: Callable[[Path], None]
    error_id: str
    code: int
    names: str
    validate: str | None = None
    inspect_ok: bool = False


def _expert_shard(root: Path) -> Path:
    return shard_of(root, f"{EXPERT}.w1.weight")


def _first_tensor(root: Path) -> str:
    """The first tensor in data order of the expert shard."""
    t = read_shard(_expert_shard(root)).tensors()
    return min(t, key=lambda k: t[k]["data_offsets"][0])


# ------------------------------------------------------------------------------------- shard headers
def header_length_past_eof(root: Path) -> None:
    path = _expert_shard(root)
    shard = read_shard(path)
    write_shard(path, shard.raw_header, shard.data, length=path.stat().st_size)


def header_not_json(root: Path) -> None:
    path = _expert_shard(root)
    shard = read_shard(path)
    raw = shard.raw_header.rstrip()  # safetensors pads the header with spaces to 8 bytes
    write_shard(path, raw[:-1] + b",", shard.data)  # the closing brace is gone


def header_not_utf8(root: Path) -> None:
    path = _expert_shard(root)
    shard = read_shard(path)
    at = shard.raw_header.index(b"experts") + 2
    write_shard(path, shard.raw_header[:at] + b"\xff" + shard.raw_header[at + 1:], shard.data)


def header_lone_surrogate(root: Path) -> None:
    """A tensor named "weird\\ud800name" (a JSON escape of half a surrogate pair: not UTF-8)."""
    add_tensor(_expert_shard(root), "weird\ud800name", "U8", [4], b"\0" * 4)


def header_offsets_overlap(root: Path) -> None:
    def edit(h):
        t = {k: v for k, v in h.items() if k != "__metadata__"}
        second = sorted(t, key=lambda k: t[k]["data_offsets"][0])[1]
        begin, end = h[second]["data_offsets"]
        h[second]["data_offsets"] = [begin - 1, end - 1]  # one byte into the first tensor
    edit_header(_expert_shard(root), edit)


def header_offsets_past_eof(root: Path) -> None:
    """The header declares one more tensor whose bytes were never written."""
    path = _expert_shard(root)
    shard = read_shard(path)
    end = len(shard.data)
    shard.header[f"{EXPERT}.w1.extra"] = {"dtype": "U8", "shape": [64], "data_offsets": [end, end + 64]}
    write_shard(path, shard.header, shard.data)


def data_region_short(root: Path) -> None:
    """An interrupted download: the last 100 bytes of the data buffer are missing."""
    path = _expert_shard(root)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def data_region_trailing_bytes(root: Path) -> None:
    with open(_expert_shard(root), "ab") as f:
        f.write(b"\0" * 16)


def header_unknown_dtype(root: Path) -> None:
    def edit(h):
        h[f"{EXPERT}.w1.weight"]["dtype"] = "F5_E3M1"
    edit_header(_expert_shard(root), edit)


def header_shape_size_mismatch(root: Path) -> None:
    def edit(h):
        shape = h[f"{EXPERT}.w1.weight"]["shape"]
        shape[0] += 1
    edit_header(_expert_shard(root), edit)


def header_duplicate_key(root: Path) -> None:
    path = _expert_shard(root)
    shard = read_shard(path)
    first = _first_tensor(root)
    entry = json.dumps({first: shard.header[first]}, separators=(",", ":"))[1:-1].encode()
    write_shard(path, shard.raw_header.rstrip()[:-1] + b"," + entry + b"}", shard.data)


def header_bad_entry(root: Path) -> None:
    def edit(h):
        h[f"{EXPERT}.w1.weight"]["shape"] = [-1, 64]
    edit_header(_expert_shard(root), edit)


def shard_empty(root: Path) -> None:
    _expert_shard(root).write_bytes(b"")


# --------------------------------------------------------------------------------------- index
def _weight_map_edit(root: Path, edit: Callable[[dict], None]) -> None:
    edit_json(root / INDEX, lambda idx: edit(idx["weight_map"]))


def index_missing_shard(root: Path) -> None:
    def edit(wm):
        wm[f"{EXPERT}.w1.weight"] = "model-00099-of-00099.safetensors"
    _weight_map_edit(root, edit)


def index_key_missing_in_shard(root: Path) -> None:
    """The index lists a tensor that its shard does not hold."""
    def edit(wm):
        wm[f"{EXPERT}.w1.bias"] = wm[f"{EXPERT}.w1.weight"]
    _weight_map_edit(root, edit)


def index_key_not_in_index(root: Path) -> None:
    def edit(wm):
        del wm[f"{EXPERT}.w1.input_scale"]
    _weight_map_edit(root, edit)


def duplicate_tensor_across_shards(root: Path) -> None:
    """A tensor of another shard is also stored (bytes and all) in the expert shard."""
    wm = json.loads((root / INDEX).read_text())["weight_map"]
    expert_file = wm[f"{EXPERT}.w1.weight"]
    name = next(k for k, v in sorted(wm.items()) if v != expert_file)
    other = read_shard(root / wm[name])
    entry = other.header[name]
    begin, end = entry["data_offsets"]
    add_tensor(root / expert_file, name, entry["dtype"], entry["shape"], other.data[begin:end])


def index_not_json(root: Path) -> None:
    (root / INDEX).write_text('{"weight_map": {')


def index_no_weight_map(root: Path) -> None:
    edit_json(root / INDEX, lambda idx: idx.__setitem__("weight_map", list(idx["weight_map"])))


# -------------------------------------------------------------------------------------- configs
def config_missing(root: Path) -> None:
    (root / "config.json").unlink()


def config_not_json(root: Path) -> None:
    (root / "config.json").write_text("{'model_type': 'deepseek_v4',}")


def hf_quant_config_not_json(root: Path) -> None:
    (root / "hf_quant_config.json").write_bytes(b"\xff\xfe not json")


def quant_config_contradicts_tensors(root: Path) -> None:
    """hf_quant_config.json says group size 32, the NVFP4 scales have one byte per 16 weights."""
    edit_json(root / "hf_quant_config.json", lambda q: q["quantization"].__setitem__("group_size", 32))


def _qc_edit(root: Path, edit: Callable[[dict], None]) -> None:
    edit_json(root / "config.json", lambda c: edit(c["quantization_config"]))


def config_group_size_32(root: Path) -> None:
    """config.json's group_size 32 (hf_quant_config.json keeps 16): NVFP4 scales are one per 16."""
    _qc_edit(root, lambda q: q.__setitem__("group_size", 32))


def layer_group_size_32(root: Path) -> None:
    _qc_edit(root, lambda q: q["quantized_layers"]["layers.0.ffn.experts"].__setitem__("group_size", 32))


def layer_algo_mxfp4(root: Path) -> None:
    edit_json(root / "hf_quant_config.json",
              lambda q: q["quantization"]["quantized_layers"]["layers.0.ffn.experts"].__setitem__("quant_algo", "MXFP4"))


def moe_algo_mxfp4(root: Path) -> None:
    _qc_edit(root, lambda q: q.__setitem__("moe_quant_algo", "MXFP4"))


def no_weights(root: Path) -> None:
    (root / INDEX).unlink()
    for p in root.glob("*.safetensors"):
        p.unlink()


# ---------------------------------------------------------------------------------- content
def missing_expert(root: Path) -> None:
    """Every tensor of one expert is gone from its shard and from the index (a half-synced copy)."""
    names = {k for k in json.loads((root / INDEX).read_text())["weight_map"] if k.startswith(f"{EXPERT}.")}
    drop_tensors(_expert_shard(root), names)
    _weight_map_edit(root, lambda wm: [wm.pop(k) for k in names])


def missing_scale(root: Path) -> None:
    """One weight lost its block scales (tensor and index entry)."""
    name = f"{EXPERT}.w2.weight_scale" if (root / "hf_quant_config.json").exists() else f"{EXPERT}.w2.scale"
    drop_tensors(shard_of(root, name), {name})
    _weight_map_edit(root, lambda wm: wm.pop(name))


def _poke(root: Path, name: str, value: bytes) -> None:
    poke_tensor_bytes(shard_of(root, name), name, 0, value)


def nan_e4m3_scale(root: Path) -> None:
    _poke(root, f"{EXPERT}.w1.weight_scale", b"\x7f")


def negative_e4m3_scale(root: Path) -> None:
    _poke(root, f"{EXPERT}.w3.weight_scale", b"\xb8")  # -1.0


def nan_e8m0_scale(root: Path) -> None:
    _poke(root, f"{EXPERT}.w1.scale", b"\xff")


def nan_global_scale(root: Path) -> None:
    _poke(root, f"{EXPERT}.w3.weight_scale_2", struct.pack("<f", float("nan")))


def synth_defect(defect: str) -> Callable[[Path], None]:
    """Rewrite the synth checkpoint at root with the same arguments plus `synth --defect DEFECT`."""
    def build(root: Path) -> None:
        rec = json.loads((root / SYNTH_MANIFEST).read_text())
        d = rec["dims"]
        write_synthetic_checkpoint(root, format=rec["format"], layers=d["layers"], experts=d["experts"],
                                   hidden=d["hidden"], intermediate=d["intermediate"], shards=len(rec["files"]),
                                   seed=rec["seed"], mtp=d["mtp"], hash_layers=d["hash_layers"],
                                   defects=(defect,), force=True)
    build.__name__ = f"synth_{defect.replace('-', '_')}"
    return build


CATALOGUE: tuple[Entry, ...] = (
    Entry("header-length-past-eof", NV, header_length_past_eof, "header.length_past_eof", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("header-not-json", NV, header_not_json, "header.not_json", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("header-not-utf8", NV, header_not_utf8, "header.not_utf8", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("header-lone-surrogate", NV, header_lone_surrogate, "header.not_utf8", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("header-duplicate-key", NV, header_duplicate_key, "header.duplicate_key", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("header-bad-entry", NV, header_bad_entry, "header.bad_entry", INPUT, f"{EXPERT}.w1.weight",
          validate="structure.shard.header"),
    Entry("header-empty-file", NV, shard_empty, "header.too_short", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("offsets-overlap", NV, header_offsets_overlap, "header.offsets_overlap", INPUT, "model-0000",
          validate="structure.shard.header"),
    Entry("offsets-past-eof", NV, header_offsets_past_eof, "header.offsets_past_eof", INPUT, f"{EXPERT}.w1.extra",
          validate="structure.shard.truncated"),
    Entry("data-region-short", NV, data_region_short, "header.offsets_past_eof", INPUT, "model-0000",
          validate="structure.shard.truncated"),
    Entry("data-region-trailing-bytes", NV, data_region_trailing_bytes, "header.data_size_mismatch", INPUT,
          "model-0000", validate="structure.shard.header"),
    Entry("unknown-dtype", NV, header_unknown_dtype, "header.unknown_dtype", INPUT, f"{EXPERT}.w1.weight",
          validate="structure.shard.header"),
    Entry("shape-size-mismatch", NV, header_shape_size_mismatch, "header.shape_size_mismatch", INPUT,
          f"{EXPERT}.w1.weight", validate="structure.shard.header"),
    Entry("duplicate-tensor-across-shards", NV, duplicate_tensor_across_shards, "index.duplicate_tensor", INPUT,
          "model-0000", validate="structure.index.keys"),
    Entry("index-missing-shard", NV, index_missing_shard, "index.missing_shard", INPUT, "model-00099-of-00099",
          validate="structure.index.missing_file"),
    Entry("index-key-missing-in-shard", NV, index_key_missing_in_shard, "index.key_missing_in_shard", INPUT,
          f"{EXPERT}.w1.bias", validate="structure.index.keys"),
    Entry("index-key-not-in-index", NV, index_key_not_in_index, "index.key_not_in_index", INPUT,
          f"{EXPERT}.w1.input_scale", validate="structure.index.keys"),
    Entry("index-not-json", NV, index_not_json, "index.not_json", INPUT, INDEX,
          validate="structure.index.keys"),
    Entry("index-bad-schema", NV, index_no_weight_map, "index.bad_schema", INPUT, INDEX,
          validate="structure.index.keys"),
    Entry("config-missing", NV, config_missing, "config.missing", INPUT, "config.json"),
    Entry("config-not-json", NV, config_not_json, "config.not_json", INPUT, "config.json"),
    Entry("hf-quant-config-not-json", NV, hf_quant_config_not_json, "hf_quant_config.not_json", INPUT,
          "hf_quant_config.json"),
    Entry("no-weights", NV, no_weights, "checkpoint.no_weights", INPUT, "no model.safetensors.index.json"),
    Entry("quant-config-group-32-vs-16-wide-scales", NV_HF, quant_config_contradicts_tensors, "detect.contradiction",
          CONTENT, "weight_scale", validate="structure.reader"),
    Entry("missing-expert", NV, missing_expert, "convert.incomplete_experts", CONTENT, "experts",
          validate="structure.experts.missing", inspect_ok=True),
    Entry("missing-scale", MX, missing_scale, "group.missing_scale", CONTENT, f"{EXPERT}.w2.weight",
          validate="structure.reader"),
    Entry("nan-global-scale", NV, nan_global_scale, "convert.bad_values", CONTENT, f"{EXPERT}.w3",
          validate="nvfp4.global.invalid", inspect_ok=True),
    # the structure rules (core/sources/structure.py) that the converter and validate share
    Entry("empty-expert", NV, synth_defect("empty-expert"), "convert.empty_expert", CONTENT,
          "layers.0.ffn.experts.0.w1.weight", validate="structure.experts.empty", inspect_ok=True),
    Entry("empty-expert-mxfp4", MX, synth_defect("empty-expert"), "convert.empty_expert", CONTENT,
          "layers.0.ffn.experts.0.w1.weight", validate="structure.experts.empty", inspect_ok=True),
    Entry("reshaped-down", NV, synth_defect("reshaped-down"), "convert.expert_dims", CONTENT,
          "layers.0.ffn.experts.0.w2.weight", validate="structure.experts.dims", inspect_ok=True),
    Entry("config-intermediate", NV, synth_defect("config-intermediate"), "convert.expert_dims", CONTENT,
          "moe_intermediate_size", validate="structure.experts.dims", inspect_ok=True),
    Entry("experts-beyond-config", NV, synth_defect("experts-beyond-config"), "convert.extra_experts", CONTENT,
          "n_routed_experts", validate="structure.experts.extra", inspect_ok=True),
)

# Value defects that the converter handles (it repacks what it can; validate reports them).
VALUE_FINDINGS: tuple[tuple[str, str, Callable[[Path], None], str], ...] = (
    ("nan-e4m3-scale", NV, nan_e4m3_scale, "nvfp4.scale.nan"),
    ("negative-e4m3-scale", NV, negative_e4m3_scale, "nvfp4.scale.negative"),
    ("e8m0-0xff-scale", MX, nan_e8m0_scale, "mxfp4.scale.nan"),
)

# Quantization-config contradictions that validate reports (exit 1). The converter writes its own
# quantization_config from the tensors, so it may convert them; it must not crash or half-write.
CONFIG_FINDINGS: tuple[tuple[str, str, Callable[[Path], None], str], ...] = (
    ("config-group-size-32", NV, config_group_size_32, "structure.quant_config.group_size"),
    ("quantized-layers-group-size-32", NV, layer_group_size_32, "structure.quant_config.layers"),
    ("quantized-layers-algo-mxfp4", NV, layer_algo_mxfp4, "structure.quant_config.layers"),
    ("moe-quant-algo-mxfp4", NV, moe_algo_mxfp4, "structure.quant_config.moe_algo"),
)
