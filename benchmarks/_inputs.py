"""The benchmark inputs (benchmarks/bench_convert.py): real-size DeepSeek-V4-Flash MoE layers written by
`synth` (random codes), more layers made from one by renaming, and a header set of a whole model whose
tensor data are holes (sparse files: the size of a real checkpoint on disk, no memory or disk used).

Why renaming and holes: writing random numbers takes minutes per 10 GB, and the converter treats every
layer alike, so layer L's bytes may be layer 0's; `inspect` and `plan` read headers, config and index
only, so the data of a header set can be absent (a hole reads as zeros)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["synth_layers", "header_set", "SMALL_TENSOR"]

SMALL_TENSOR = 4096  # bytes: tensors up to this size (globals, input scales) keep their real bytes in a header set


def synth_layers(out: Path, fmt: str, layers: int, shard_gib: float, experts: int = 256) -> float:
    """Write `layers` real-size layers (`experts` experts each; 256 is DeepSeek-V4-Flash) in shards of
    `shard_gib`: one written by synth, the others made by _replicate. Seconds taken."""
    code = ("from pathlib import Path; from dataclasses import replace\n"
            "from dsv4_convert.synth import write_synthetic_checkpoint\n"
            "from dsv4_convert.synth.realsize import REAL_SIZE\n"
            "import sys\n"
            f"write_synthetic_checkpoint(Path(sys.argv[1]), format={fmt!r}, real_size=True, force=True, "
            f"real_size_dims=replace(REAL_SIZE, layers=1, experts={experts}), shard_bytes=int({shard_gib} * 2**30))")
    t = time.perf_counter()
    one = out.with_name(out.name + "-1") if layers > 1 else out
    subprocess.run([sys.executable, "-c", code, str(one)], check=True)
    if layers > 1:
        _replicate(one, out, layers)
        subprocess.run(["rm", "-rf", str(one)], check=True)
    return time.perf_counter() - t


def _read_header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def _header_bytes(header: dict) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _configs(one: Path, out: Path, layers: int, experts: int | None, weight_map: dict, total: int) -> None:
    """config.json / index / the small files of `one`, for `layers` layers (and `experts` experts)."""
    for f in one.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",
                                                                                   "model.safetensors.index.json"):
            (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((one / "config.json").read_text())
    config["num_hidden_layers"] = layers
    if experts is not None:
        config["n_routed_experts"] = experts
    (out / "config.json").write_text(json.dumps(config, indent=2))
    index = json.loads((one / "model.safetensors.index.json").read_text())
    index["weight_map"], index["metadata"]["total_size"] = weight_map, total
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _replicate(one: Path, out: Path, layers: int) -> None:
    """`layers` real-size layers made from the one-layer checkpoint `one` in seconds, not minutes of
    random numbers: layer L's shards hold layer 0's bytes under the names layers.L.* (random codes either
    way; the converter treats every layer alike); tensors outside layer 0 (the output head) stay once, in
    layer 0's shards. One thread per new shard (copy_file_range, the kept tensors' byte ranges)."""
    out.mkdir(parents=True)
    shards = sorted(one.glob("*.safetensors"))

    def copy(job):
        layer, shard = job
        name = shard.name if layer == 0 else f"layer{layer}-{shard.name}"
        n, header = _read_header(shard)
        kept = sorted(((k, v) for k, v in header.items() if k != "__metadata__" and (layer == 0 or "layers.0." in k)),
                      key=lambda kv: kv[1]["data_offsets"][0])
        renamed, runs, at = {"__metadata__": header.get("__metadata__", {})}, [], 0
        for k, v in kept:
            begin, end = v["data_offsets"]
            renamed[k.replace("layers.0.", f"layers.{layer}.", 1)] = {**v, "data_offsets": [at, at + end - begin]}
            if runs and runs[-1][1] == begin:
                runs[-1][1] = end
            else:
                runs.append([begin, end])
            at += end - begin
        if len(renamed) == 1:
            return {}, 0
        with open(shard, "rb") as f, open(out / name, "wb") as g:
            g.write(_header_bytes(renamed))
            g.flush()
            for begin, end in runs:
                left, src_at = end - begin, 8 + n + begin
                while left:
                    done = os.copy_file_range(f.fileno(), g.fileno(), left, src_at)
                    left, src_at = left - done, src_at + done
        return {k: name for k in renamed if k != "__metadata__"}, at

    weight_map, total = {}, 0
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for names, nbytes in pool.map(copy, [(layer, s) for layer in range(layers) for s in shards]):
            weight_map.update(names)
            total += nbytes
    _configs(one, out, layers, None, weight_map, total)


def header_set(one: Path, out: Path, layers: int, experts: int = 256, shard_gib: float = 4.0) -> int:
    """A whole model's header set from `one` (a real-size layer with any number of experts): `layers`
    layers of `experts` experts, every expert's tensors named and shaped as expert 0's, in shards of
    about `shard_gib`, the data holes except tensors of up to SMALL_TENSOR bytes (expert 0's bytes, so
    the globals are real numbers). The head and other tensors outside the experts come once. Returns
    the tensor count."""
    out.mkdir(parents=True)
    entries = []  # (name, header entry, source file, source offset)
    pattern = re.compile(r"^(.*?)layers\.0\.(.*?experts\.)(\d+)\.(.*)$")
    expert0, others = [], []
    for shard in sorted(one.glob("*.safetensors")):
        n, header = _read_header(shard)
        for name, v in header.items():
            if name == "__metadata__":
                continue
            m = pattern.match(name)
            at = (shard, 8 + n + v["data_offsets"][0])
            if m is None:
                others.append((m, name, v, at))
            elif m[3] == "0":  # the other experts are made from expert 0
                expert0.append((m, name, v, at))
    for layer in range(layers):
        for e in range(experts):
            for m, _, v, at in expert0:
                entries.append((f"{m[1]}layers.{layer}.{m[2]}{e}.{m[4]}", v, *at))
    entries += [(name, v, *at) for _, name, v, at in others]
    weight_map, total, shard_bytes, files = {}, 0, int(shard_gib * 2**30), []
    current, size = [], 0
    for entry in entries:
        nbytes = entry[1]["data_offsets"][1] - entry[1]["data_offsets"][0]
        if current and size + nbytes > shard_bytes:
            files.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    files.append(current)
    for i, group in enumerate(files):
        name = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        header, at, small = {"__metadata__": {"format": "pt"}}, 0, []
        for tensor, v, src, src_at in group:
            nbytes = v["data_offsets"][1] - v["data_offsets"][0]
            header[tensor] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [at, at + nbytes]}
            if nbytes <= SMALL_TENSOR:
                small.append((at, src, src_at, nbytes))
            weight_map[tensor] = name
            at += nbytes
        head = _header_bytes(header)
        with open(out / name, "wb") as g:
            g.write(head)
            for offset, src, src_at, nbytes in small:
                with open(src, "rb") as f:
                    f.seek(src_at)
                    g.seek(len(head) + offset)
                    g.write(f.read(nbytes))
            g.truncate(len(head) + at)  # the rest stays a hole
        total += at
    _configs(one, out, layers, experts, weight_map, total)
    return len(entries)
