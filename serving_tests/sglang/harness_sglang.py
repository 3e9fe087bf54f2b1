"""Runs inside each spawned gloo rank for the SGLang tests (see test_sglang_plugin.py for the list of
CPU substitutions and why each one is there)."""

from __future__ import annotations

import contextlib
import os

import torch
from common import compare_params
from layer_cases import FINAL, case_tensors

import synth

PREFIX = "model.layers.0.mlp.experts"  # SGLang's module name for checkpoint `layers.0.ffn.experts`


def _reference_repack(b_q_weight, perm, size_k, size_n, num_bits, **_):
    """Substitute for SGLang's JIT CUDA `gptq_marlin_repack` (FP4, no act-order): the project's
    `to_marlin_weight`, pinned to the engines' bytes by tests/formats/test_golden.py."""
    from dsv4_convert.formats.marlin.weight import to_marlin_weight

    assert num_bits == 4 and perm.numel() == 0
    assert tuple(b_q_weight.shape) == (size_k // 8, size_n)
    packed = b_q_weight.t().contiguous().view(torch.uint8)  # [N, K/2], nibble order unchanged
    return to_marlin_weight(packed)


def _dummy_workspace(device, max_blocks_per_sm=1):
    """Substitute for `marlin_make_workspace` (reads CUDA SM count); runtime-only, never compared."""
    return torch.zeros(1, dtype=torch.int, device=device)


@contextlib.contextmanager
def sglang_cpu(*, world: int, rank: int, ep: bool, dtype: torch.dtype):
    from sglang.srt.layers.quantization import marlin_utils, marlin_utils_fp4
    from sglang.srt.runtime_context import get_context, get_parallel, override_platform

    marlin_utils_fp4.gptq_marlin_repack = _reference_repack
    marlin_utils_fp4.marlin_make_workspace = _dummy_workspace
    marlin_utils.marlin_make_workspace = _dummy_workspace
    ov = get_context().override_server_args(
        tp_size=world,
        ep_size=world if ep else 1,
        moe_runner_backend="marlin",
        dtype=str(dtype).removeprefix("torch."),
    )
    ov.install()
    from sglang.srt.layers.moe.utils import initialize_moe_config

    initialize_moe_config()  # what the scheduler does after publish: reads --moe-runner-backend
    ranks = {"tp_rank": rank, "moe_ep_rank": rank if ep else 0, "moe_tp_rank": 0 if ep else rank}
    get_parallel().override_permanently(**ranks)
    try:
        with override_platform(is_sm120=True):
            yield
    finally:
        ov.restore()


@contextlib.contextmanager
def gpu_loader(on: bool):
    """SGLang's FusedMoE loader takes its `use_padded_loading` branch on CPU only (`_is_cpu`); on the
    sm_120 GPU with the Marlin runner it is False, and that branch is the one that offsets each rank by
    the checkpoint's per-rank size (the CPU branch offsets by the padded parameter size)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    if not on:
        yield
        return
    saved = FusedMoE.__dict__["use_padded_loading"]
    FusedMoE.use_padded_loading = property(lambda self: False)
    try:
        yield
    finally:
        FusedMoE.use_padded_loading = saved


def _real_regions(c: dict) -> dict:
    """Source-space (rows, packed columns, scale columns) of the real data per projection stack."""
    h, i_s, i_pad = c["hidden"], c["i_shard"], c["i_pad"]
    w13_rows = torch.cat([torch.arange(i_s), i_pad + torch.arange(i_s)])
    return {"w13": (w13_rows, h // 2, h // 32), "w2": (torch.arange(h), i_s // 2, i_s // 32)}


def _source_space(layer, stack: str, c: dict):
    """Undo the Marlin packing (the project's inverse codec) for every local expert: (weight, scale)."""
    from dsv4_convert.core.targets.target import MarlinTarget
    from dsv4_convert.formats.marlin import marlin_to_mxfp4

    n, k = (2 * c["i_pad"], c["h_pad"]) if stack == "w13" else (c["h_pad"], c["i_pad"])
    q, s = getattr(layer, f"{stack}_weight").data, getattr(layer, f"{stack}_weight_scale").data
    out = [marlin_to_mxfp4(q[e], s[e], target=MarlinTarget(engine="sglang"), n=n, k=k) for e in range(q.shape[0])]
    return torch.stack([w for w, _ in out]), torch.stack([sc.view(torch.uint8) for _, sc in out])


def _emulated_moe(w13, w2, x, c: dict) -> torch.Tensor:
    """One expert's SwiGLU MoE output [T, H] from Marlin tensors, with validate/emulate.py's kernel
    emulation (activations zero-padded to H_pad as SGLang's apply() does; output cut back to H)."""
    from dsv4_convert.core.checkpoint.tensor_model import Quant
    from dsv4_convert.validate.emulate import marlin_dequantize

    i_pad, h_pad, h = c["i_pad"], c["h_pad"], c["hidden"]
    kw = dict(quant=Quant.MXFP4, act_dtype="bfloat16", w4a8=False)
    W13 = marlin_dequantize(*w13, None, n=2 * i_pad, k=h_pad, **kw)
    W2 = marlin_dequantize(*w2, None, n=h_pad, k=i_pad, **kw)
    xp = torch.nn.functional.pad(x, (0, h_pad - h))
    y = xp @ W13.T
    a = torch.nn.functional.silu(y[:, :i_pad]) * y[:, i_pad:]
    return (a @ W2.T)[:, :h]


def source_reference(src, c: dict, *, rank: int, world: int, ep: bool) -> dict:
    """Where SGLang's own path cannot load a shape: this rank's slice of the unconverted source, in the
    source-space layout `_source_space` gives (w13 = [w1 rows; w3 rows] at 0 and I_pad), as reference."""
    experts = len({k.split(".")[4] for k in src})
    local = range(rank * experts // world, (rank + 1) * experts // world) if ep else range(experts)
    r = 0 if ep else rank
    i_s, i_pad, h = c["i_shard"], c["i_pad"], c["hidden"]
    out = {}
    for stack in ("w13", "w2"):
        ws, ss = [], []
        for e in local:
            name = f"{synth.CONTAINER}.{e}"
            if stack == "w13":
                w = torch.zeros(2 * i_pad, h // 2, dtype=torch.uint8)
                s = torch.zeros(2 * i_pad, h // 32, dtype=torch.uint8)
                for half, p in enumerate(("w1", "w3")):
                    w[half * i_pad:half * i_pad + i_s] = src[f"{name}.{p}.weight"].view(torch.uint8)[r * i_s:(r + 1) * i_s]
                    s[half * i_pad:half * i_pad + i_s] = src[f"{name}.{p}.scale"].view(torch.uint8)[r * i_s:(r + 1) * i_s]
            else:
                w = src[f"{name}.w2.weight"].view(torch.uint8)[:, r * i_s // 2:(r + 1) * i_s // 2]
                s = src[f"{name}.w2.scale"].view(torch.uint8)[:, r * i_s // 32:(r + 1) * i_s // 32]
            ws.append(w)
            ss.append(s)
        out[stack] = (torch.stack(ws), torch.stack(ss))
    return out


def padding_evidence(engine, plugin, c: dict) -> dict:
    """SGLang leaves the padding to torch.empty; dsv4-convert writes zeros there. Returns (a) the byte
    comparison of the real region only, in source space, and (b) whether the emulated GEMM output of
    expert 0 changes when the padding holds random bytes instead of zeros (w13's padding with w2's
    zeros, w2's padding with w13's zeros: each padded product has one zero side)."""
    from common import byte_diff

    from dsv4_convert.core.targets.target import MarlinTarget
    from dsv4_convert.formats.marlin import mxfp4_to_marlin

    regions = _real_regions(c)
    real = {}
    packed = {}
    for stack, (rows, wcols, scols) in regions.items():
        ew, es = engine[stack] if isinstance(engine, dict) else _source_space(engine, stack, c)
        pw, ps = _source_space(plugin, stack, c)
        packed[stack] = (pw[0], ps[0])
        real[f"{stack}_weight"] = byte_diff(pw[:, rows, :wcols], ew[:, rows, :wcols])
        real[f"{stack}_weight_scale"] = byte_diff(ps[:, rows, :scols], es[:, rows, :scols])
    g = torch.Generator().manual_seed(7)
    target = MarlinTarget(engine="sglang")

    def repack(stack, randomize):
        w, s = (t.clone() for t in packed[stack])
        if randomize:
            rows, wcols, scols = regions[stack]
            wm = torch.ones_like(w, dtype=torch.bool)
            wm[rows.unsqueeze(1), torch.arange(wcols)] = False
            sm = torch.ones_like(s, dtype=torch.bool)
            sm[rows.unsqueeze(1), torch.arange(scols)] = False
            w[wm] = torch.randint(0, 256, (int(wm.sum()),), generator=g, dtype=torch.uint8)
            s[sm] = torch.randint(110, 140, (int(sm.sum()),), generator=g, dtype=torch.uint8)
        return mxfp4_to_marlin(w, s.view(torch.float8_e8m0fnu), target=target)

    x = torch.randn(8, c["hidden"], generator=g)
    base = _emulated_moe(repack("w13", False), repack("w2", False), x, c)
    e0 = (plugin.w13_weight.data[0], plugin.w13_weight_scale.data[0])
    repack_is_identity = byte_diff(repack("w13", False)[0], e0[0]) is None and \
        byte_diff(repack("w13", False)[1].view(torch.uint8), e0[1].view(torch.uint8)) is None
    return {
        "real_diff": real,
        "repack_is_identity": repack_is_identity,
        "gemm_same_w13_padding_random": bool(torch.equal(_emulated_moe(repack("w13", True), repack("w2", False), x, c), base)),
        "gemm_same_w2_padding_random": bool(torch.equal(_emulated_moe(repack("w13", False), repack("w2", True), x, c), base)),
        # negative control: garbage on both sides of the padded product does change the output
        "gemm_same_both_random": bool(torch.equal(_emulated_moe(repack("w13", True), repack("w2", True), x, c), base)),
        "gemm_nonzero": bool(base.abs().sum() > 0),
    }


def make_layer(quant_config, *, experts: int, hidden: int, inter: int, dtype: torch.dtype):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    with set_default_torch_dtype(dtype):  # as SGLang's model loader builds every layer
        return _fused_moe(FusedMoE, quant_config, experts=experts, hidden=hidden, inter=inter, dtype=dtype)


def _fused_moe(FusedMoE, quant_config, *, experts: int, hidden: int, inter: int, dtype: torch.dtype):  # noqa: N803
    return FusedMoE(
        num_experts=experts,
        hidden_size=hidden,
        intermediate_size=inter,
        layer_id=0,
        top_k=2,
        params_dtype=dtype,
        quant_config=quant_config,
        prefix=PREFIX,
    )


def load_like_dsv4(layer, tensors: dict[str, torch.Tensor], *, experts: int) -> list[str]:
    """Feed checkpoint tensors to the layer the way SGLang's DeepseekV4ForCausalLM.load_weights does:
    its own name remap, FusedMoE.make_expert_params_mapping, then each parameter's weight_loader.
    Returns the checkpoint names that found no parameter (SGLang skips those)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj",
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj",
        num_experts=experts,
    )
    params = {f"{PREFIX}.{n}": p for n, p in layer.named_parameters()}
    skipped = []
    for ckpt_name, tensor in tensors.items():
        name = DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(ckpt_name)
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in name:
                continue
            resolved = name.replace(weight_name, param_name)
            if resolved not in params:
                skipped.append(ckpt_name)
                break
            param = params[resolved]
            param.weight_loader(param, tensor, resolved, shard_id=shard_id, expert_id=expert_id)
            break
    return skipped


def engine_config(fmt: str):
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    if fmt == "mxfp4":
        cfg = Fp8Config.from_config(synth.DSV4_FP8)
        cfg.is_fp4_experts = True  # what SGLang's loader sets for DeepSeek-V4 FP4 experts
        return cfg
    return ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16, exclude_modules=[])


def plugin_config(qc: dict):
    from sglang.srt.layers.quantization import get_quantization_config

    return get_quantization_config(qc["quant_method"]).from_config(qc)


def run_case(
    rank: int,
    world: int,
    *,
    fmt: str,
    act_dtype: str,
    ep: bool,
    experts: int,
    hidden: int,
    inter: int,
    convert_for: str = "sglang",
    small_scales: tuple[int, ...] = (),
    checkpoints: list | None = None,
    padded: dict | None = None,
) -> dict:
    """One scenario on this rank: (a) the engine's own method on the source, (b) the plugin on the
    converted tensors; returns the byte comparison of every final expert parameter."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # ServerArgs(model_path="dummy") must not look for a model online
    from sglang.srt.plugins import load_plugins

    load_plugins()
    dtype = getattr(torch, act_dtype)
    src, conv, qc, layout = case_tensors(fmt, "sglang", act_dtype=act_dtype, experts=experts, hidden=hidden,
                                         inter=inter, convert_for=convert_for, small_scales=small_scales,
                                         padded=padded, checkpoints=checkpoints)
    from dsv4_convert.serving.config import PluginConfigError

    with sglang_cpu(world=world, rank=rank, ep=ep, dtype=dtype), gpu_loader(padded is not None):
        engine = make_layer(engine_config(fmt), experts=experts, hidden=hidden, inter=inter, dtype=dtype)
        engine_error = None
        try:
            engine_skipped = load_like_dsv4(engine, src, experts=experts)
            engine.quant_method.process_weights_after_loading(engine)
        except RuntimeError as e:  # SGLang's own path cannot load this shape (H padding: see SERVING.md)
            if padded is None:
                raise
            engine_error, engine_skipped = f"{type(e).__name__}: {e}", []
        try:
            plugin = make_layer(plugin_config(qc), experts=experts, hidden=hidden, inter=inter, dtype=dtype)
        except PluginConfigError as e:
            return {"refused": str(e), "engine_method": type(engine.quant_method).__name__}
        skipped = load_like_dsv4(plugin, conv, experts=experts)
        plugin.quant_method.process_weights_after_loading(plugin)
    extra = {}
    if layout is not None and layout["containers"][synth.CONTAINER]["status"] == "pad":
        c = layout["containers"][synth.CONTAINER]
        reference = source_reference(src, c, rank=rank, world=world, ep=ep) if engine_error else engine
        extra = padding_evidence(reference, plugin, c)
    if engine_error:
        extra["engine_error"] = engine_error
    return {
        **extra,
        "shapes": {n: list(getattr(plugin, n).shape) for n in FINAL[fmt]},
        "engine_method": type(engine.quant_method).__name__,
        "plugin_method": type(plugin.quant_method).__name__,
        "local_experts": int(plugin.w13_weight.shape[0]),
        "engine_skipped": sorted(set(engine_skipped)),
        "skipped": sorted(set(skipped)),
        "diff": compare_params(engine, plugin, FINAL[fmt]),
    }


def run_cases(rank: int, world: int, *, cases: list[dict]) -> dict:
    return {c["id"]: run_case(rank, world, **{k: v for k, v in c.items() if k != "id"}) for c in cases}
