"""Independent per-rank references for padded (`--tp/--ep`) outputs, and header-only real-size sources.

The reference for rank r of an experts layer is tests/helpers/engine_stacks.py applied to that
rank's source slice (gate/up rows, down columns) of every expert, with the engine's padded sizes:
the engine-equivalent padded stacks that the golden cases (tests/golden/) and the plugin tests pin
against the engines' own code. Our output is one tensor per projection per expert; rank r's block
is cut out here by plain index arithmetic (not with formats/padded_layout.py, the code under test).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import safe_open

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin.scales import vllm_rescale_factor
from tests.helpers.ckpt_factory import write_json
from tests.helpers.compare import assert_bytes_equal
from tests.helpers.engine_stacks import mxfp4_moe_to_marlin, nvfp4_moe_to_marlin

__all__ = ["assert_rank_blocks", "gptoss_headers", "load_out", "rank_reference", "write_header_only"]

GROUP = {"nvfp4": 16, "mxfp4": 32}


def rank_reference(fmt: str, target: MarlinTarget, experts: list[dict], *, r: int, m: int, i_pad: int,
                   h_pad: int) -> dict[str, torch.Tensor]:
    """engine_stacks' final tensors for MoE-TP rank r of `m`: `experts` is one {gate, up, down:
    (packed [N, K/2], scale [N, K/g], ModelOpt global or None)} per expert, in order. NVFP4 for vllm
    uses the whole stack's rescale factors (docs/FORMAT.md: the converter keeps the per-stack factor;
    the vLLM plugin re-derives it over what its rank holds)."""
    g = GROUP[fmt]
    inter = experts[0]["gate"][0].shape[0]
    s = inter // m
    rows = slice(r * s, (r + 1) * s)
    w13 = torch.stack([torch.cat((e["gate"][0][rows], e["up"][0][rows])) for e in experts])
    s13 = torch.stack([torch.cat((e["gate"][1][rows], e["up"][1][rows])) for e in experts])
    w2 = torch.stack([e["down"][0][:, r * s // 2:(r + 1) * s // 2] for e in experts])
    s2 = torch.stack([e["down"][1][:, r * s // g:(r + 1) * s // g] for e in experts])
    if fmt == "nvfp4":
        g13 = torch.stack([torch.stack((e["gate"][2].reshape(()), e["up"][2].reshape(()))) for e in experts])
        g2 = torch.stack([e["down"][2].reshape(()) for e in experts])
        sf = None
        if target.engine == "vllm":
            full13 = torch.stack([torch.cat((e["gate"][1], e["up"][1])) for e in experts])
            full2 = torch.stack([e["down"][1] for e in experts])
            sf = (vllm_rescale_factor(full13, target.act_dtype), vllm_rescale_factor(full2, target.act_dtype))
        return nvfp4_moe_to_marlin(w13, s13, g13, w2, s2, g2, target=target, i_pad=i_pad, sf=sf)
    return mxfp4_moe_to_marlin(w13, s13, w2, s2, target=target, i_pad=i_pad, h_pad=h_pad)


def load_out(root: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(Path(root).glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118
    return out


def assert_rank_blocks(out: dict, keys: tuple[str, str, str], ref: dict, e: int, *, r: int, fmt: str,
                       i_pad: int) -> None:
    """Rank r's blocks of expert e's (gate, up, down) output tensors == the reference's expert e."""
    g = GROUP[fmt]
    gate, up, down = keys
    n2 = 2 * i_pad
    assert_bytes_equal(out[f"{gate}.weight"][:, r * n2:(r + 1) * n2], ref["w13_weight"][e][:, :n2], f"{gate} rank {r}")
    assert_bytes_equal(out[f"{up}.weight"][:, r * n2:(r + 1) * n2], ref["w13_weight"][e][:, n2:], f"{up} rank {r}")
    cols = slice(r * i_pad, (r + 1) * i_pad)
    assert_bytes_equal(out[f"{gate}.weight_scale"][:, cols], ref["w13_weight_scale"][e][:, :i_pad], f"{gate} scale")
    assert_bytes_equal(out[f"{up}.weight_scale"][:, cols], ref["w13_weight_scale"][e][:, i_pad:], f"{up} scale")
    k16, kg = i_pad // 16, i_pad // g
    assert_bytes_equal(out[f"{down}.weight"][r * k16:(r + 1) * k16], ref["w2_weight"][e], f"{down} rank {r}")
    assert_bytes_equal(out[f"{down}.weight_scale"][r * kg:(r + 1) * kg], ref["w2_weight_scale"][e], f"{down} scale")
    if fmt == "nvfp4":
        assert_bytes_equal(out[f"{gate}.weight_global_scale"], ref["w13_weight_scale_2"][e], f"{gate} global")
        assert_bytes_equal(out[f"{down}.weight_global_scale"], ref["w2_weight_scale_2"][e], f"{down} global")


def write_header_only(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A safetensors file whose header declares `tensors` (name -> (dtype, shape)) and whose data is a
    sparse hole of the right size: real headers and file sizes for plan / --dry-run, no data written."""
    size = {"U8": 1, "I8": 1, "F8_E8M0": 1, "F8_E4M3": 1, "BF16": 2, "F32": 4}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)


def gptoss_headers(root, experts=32, hidden=2880, inter=2880, layers=1):
    """A gpt-oss-20b-shaped checkpoint from headers only: the real tensor names, dtypes and shapes."""
    root.mkdir(parents=True)
    write_json(root / "config.json", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_local_experts": experts,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}})
    t = {"model.embed_tokens.weight": ("BF16", (64, hidden))}
    for L in range(layers):
        p = f"model.layers.{L}.mlp"
        t[f"{p}.router.weight"] = ("BF16", (experts, hidden))
        t[f"{p}.experts.gate_up_proj_blocks"] = ("U8", (experts, 2 * inter, hidden // 32, 16))
        t[f"{p}.experts.gate_up_proj_scales"] = ("U8", (experts, 2 * inter, hidden // 32))
        t[f"{p}.experts.gate_up_proj_bias"] = ("BF16", (experts, 2 * inter))
        t[f"{p}.experts.down_proj_blocks"] = ("U8", (experts, hidden, inter // 32, 16))
        t[f"{p}.experts.down_proj_scales"] = ("U8", (experts, hidden, inter // 32))
        t[f"{p}.experts.down_proj_bias"] = ("BF16", (experts, hidden))
    write_header_only(root / "model.safetensors", t)
    return root, t
