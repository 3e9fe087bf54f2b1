"""Small in-memory projections for check tests (no files): quantize a random matrix with the codecs."""

from __future__ import annotations

import torch

from dsv4_convert.core.checkpoint.tensor_model import Projection, Quant, Role, TensorRef
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin
from dsv4_convert.formats.mxfp4 import quantize_mxfp4
from dsv4_convert.formats.nvfp4 import quantize_nvfp4
from dsv4_convert.validate.inputs import MarlinTensors, Options, ProjectionTensors


def ref(name: str, dtype: str = "U8", shape=(1,)) -> TensorRef:
    return TensorRef(name, "model-00001-of-00001.safetensors", dtype, tuple(shape), 0, 1)


def projection(quant: Quant, *, n: int = 128, k: int = 256, role: Role = Role.GATE, expert: int = 0,
               layer: str = "0") -> Projection:
    w = {Role.GATE: "w1", Role.UP: "w3", Role.DOWN: "w2"}[role]
    key = f"layers.{layer}.ffn.experts.{expert}.{w}"
    scale = "weight_scale" if quant is Quant.NVFP4 else "scale"
    return Projection(key=key, layer=layer, expert=expert, role=role, quant=quant, n=n, k=k,
                      weight=ref(f"{key}.weight"), scale=ref(f"{key}.{scale}"),
                      global_scale=ref(f"{key}.weight_scale_2", "F32") if quant is Quant.NVFP4 else None)


def nvfp4_tensors(*, n=128, k=256, seed=0, role=Role.GATE, expert=0, global_scale=None) -> ProjectionTensors:
    gen = torch.Generator().manual_seed(seed)
    w, s, g = quantize_nvfp4(torch.randn(n, k, generator=gen), global_scale)
    return ProjectionTensors(projection(Quant.NVFP4, n=n, k=k, role=role, expert=expert), w, s, g,
                             file="model-00001-of-00001.safetensors")


def mxfp4_tensors(*, n=128, k=256, seed=0, role=Role.GATE, expert=0) -> ProjectionTensors:
    gen = torch.Generator().manual_seed(seed)
    w, s = quantize_mxfp4(torch.randn(n, k, generator=gen))
    return ProjectionTensors(projection(Quant.MXFP4, n=n, k=k, role=role, expert=expert), w, s, None,
                             file="model-00001-of-00001.safetensors")


def set_scale_byte(p: ProjectionTensors, pos, value: int) -> ProjectionTensors:
    b = p.scale.contiguous().view(torch.uint8).clone()
    b[pos] = value
    return ProjectionTensors(p.proj, p.weight, b.view(p.scale.dtype), p.global_scale, p.sf, p.file)


def marlin_of(src: ProjectionTensors, *, engine="sglang", act_dtype="bfloat16") -> MarlinTensors:
    """The projection as the converter writes it, with `src` as its --against reference."""
    t = MarlinTarget(engine=engine, act_dtype=act_dtype)
    if src.quant is Quant.NVFP4:
        q, s = nvfp4_to_marlin(src.weight, src.scale, target=t)
        g = nvfp4_global_to_marlin(src.global_scale, fp32_global=t.fp32_global, act_dtype=act_dtype)
    else:
        q, s = mxfp4_to_marlin(src.weight, src.scale, target=t)
        g = None
    return MarlinTensors(src.proj, q, s, g, src.global_scale, t, 1.0, reference=src)


def run(chk, arg, opts: Options | None = None):
    return list(chk(arg, opts or Options()))


def refresh(p: ProjectionTensors) -> ProjectionTensors:
    """Forget the cached per-block arrays after a test edits the tensors in place."""
    for k in ("scale_bytes", "scale_np", "block_max_code", "block_nonzero", "global_value", "nonfinite_blocks",
              "zero_blocks", "scale_values", "block_absmax"):
        p.__dict__.pop(k, None)
    return p


# ---- real checkpoints on disk (synth), seen the way the runner sees them ---------------------------
def synth(root, *, defects=(), format="nvfp4-modelopt-dsv4", **kw):
    """A small synthetic checkpoint (1 layer, 4 experts, H=128, I=64, 2 shards) and its synth.json
    record of every injected defect (which tensors, which expert)."""
    import json
    from pathlib import Path

    from dsv4_convert.synth import write_synthetic_checkpoint

    args = dict(layers=1, experts=4, hidden=128, intermediate=64, shards=2) | kw
    out = write_synthetic_checkpoint(Path(root), format=format, defects=list(defects), force=True, **args)
    return out, json.loads((out / "synth.json").read_text())["defects"]


def on_disk(root, opts: Options | None = None):
    """The CheckpointInput the runner builds for `root` (with the reader's error, if it refused it)."""
    from dataclasses import replace
    from pathlib import Path

    from dsv4_convert.validate.runner import checkpoint_input

    cin, error = checkpoint_input(Path(root), opts or Options())
    return replace(cin, reader_error=error)


def loaded(root, proj: Projection, sf: float = 1.0) -> ProjectionTensors:
    """One projection read from the files with the production reader, as the runner hands it to checks."""
    from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection

    with TensorReader(root) as reader:
        d = load_projection(reader, proj)
    return ProjectionTensors(proj, d.weight, d.scale, d.global_scale, sf=sf, file=proj.weight.file)
