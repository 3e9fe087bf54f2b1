"""Converted checkpoints of the model families, for the whole-model engine tests (engine-free: the real
CLI in subprocesses): `dsv4-convert synth --family F --format FMT` (synth/families.py: the family's real
names, config.json and quantisation config at shrunk sizes), then `nvfp4-to-marlin` for the engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from synth import converter_cli

__all__ = ["CASES", "make_family"]

# (family, source format): the releases each stands for are in core/naming.py FAMILIES
CASES = (
    ("qwen3-moe", "nvfp4-modelopt-hf"),
    ("qwen3-moe", "nvfp4-ct"),
    ("glm4-moe", "nvfp4-modelopt-hf"),
    ("glm4-moe", "nvfp4-ct"),
)


def _run(*args) -> None:
    proc = subprocess.run([*converter_cli(), *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"dsv4-convert {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")


def make_family(tmp, family: str, fmt: str, engine: str, *, no_block: bool = False) -> tuple[Path, Path]:
    """(source, converted for `engine`). `no_block`: config.json without its quantization_config (the first
    nvidia/DeepSeek-R1-FP4 export), so only hf_quant_config.json says how the model is quantised."""
    tag = f"{family}-{fmt}{'-noblock' if no_block else ''}"
    src, out = Path(tmp, f"src-{tag}"), Path(tmp, f"conv-{tag}-{engine}")
    if not src.exists():
        _run("synth", src, "--family", family, "--format", fmt, "-q")
        if no_block:
            config = json.loads((src / "config.json").read_text())
            config.pop("quantization_config", None)
            (src / "config.json").write_text(json.dumps(config, indent=2))
    if not out.exists():
        # the proof decides what is served (the converter's gate reads its results), so it converts
        # whatever family it is proving
        _run("nvfp4-to-marlin", src, out, "--target", engine, "--workers", 1, "-q", "--allow-unservable")
    return src, out
