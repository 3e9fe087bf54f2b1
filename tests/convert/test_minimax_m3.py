"""MiniMax-M3 / M3.1 as a user meets them: M3.1's own format (`nvfp4-ct-mxfp8`: quant_method mxfp8 linears,
compressed-tensors NVFP4 experts) is detected, converted for the engine that serves it (vLLM 0.34) and refused with the
engine's own reason where the release cannot load it (SGLang 0.5.23), validated against its source, and planned; and
nvidia/MiniMax-M3-NVFP4's 250 GB fit 4 x 96 GB at the width its experts have.

Substitutions: the checkpoints are `dsv4-convert synth --family minimax-m3 / minimax-m3-vl` replicas (synth/families.py
names the public facts; tiny sizes, synthetic values), not the released weights; the 250 GB plan reads headers built
in memory with the release's shapes (transformers 5.20 MiniMaxM3VLTextConfig defaults: hidden 6144, expert width 3072,
128 experts, 60 layers of which vLLM 0.33's MiniMaxM3TextConfig makes the first 3 dense, 64 heads, 4 KV heads), the
non-expert bytes the rest of 250 GB (this test's assumption). The converter's gate is exercised, not lifted: the
conversions and plans here drop DSV4_CONVERT_ALLOW_UNSERVABLE (tests/conftest.py sets it for the other tests). The CLI
command lines run in three CLI processes, in order (run_cli_batch: `main(argv)` each, as the console script runs it,
its exit code, stdout and stderr): the replicas made, then the conversions and plans (the variable removed), then
validate; not one process each: a process start costs more than these commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Checkpoint, Projection, Quant, Role, TensorRef
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.sources.detect import detect_format
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.planner.launch import make_plan, shape_from_checkpoint
from tests.helpers.cli import run_cli_steps

GIB = 1 << 30
NO_FLAG = {"DSV4_CONVERT_ALLOW_UNSERVABLE": None}  # removed (tests/conftest.py sets it for the converter's tests)
M31 = "nvfp4-ct-mxfp8"
FAMILIES = ["minimax-m3", "minimax-m3-vl"]



@pytest.fixture(scope="module")
def m31(tmp_path_factory):
    """family -> (source, its vLLM conversion): the text and the VL replica in M3.1's format; (family, step) -> the
    CLI's answers the tests read, and (family, "dir")."""
    root = tmp_path_factory.mktemp("minimax")
    out = {f: (root / f"src-{f}", root / f"conv-{f}") for f in FAMILIES}
    runs = run_cli_steps({(f, "synth"): ["synth", src, "--family", f, "--format", M31, "--layers", 2, "--experts", 8, "-q"]
                   for f, (src, _) in out.items()}, root)
    vl_src, vl_conv = out["minimax-m3-vl"]
    runs.update(run_cli_steps({**{(f, "convert"): ["nvfp4-to-marlin", src, conv, "--target", "vllm", "-q"]  # served: no flag
                           for f, (src, conv) in out.items()},
                        **{(f, "sglang"): ["nvfp4-to-marlin", src, root / f"sglang-{f}", "--target", "sglang", "-q"]
                           for f, (src, _) in out.items()},
                        ("plan", "vllm-src"): ["plan", vl_src, "--gpus", 4, "--target", "vllm", "--json"],
                        ("plan", "vllm-conv"): ["plan", vl_conv, "--gpus", 4, "--target", "vllm", "--json"],
                        ("plan", "sglang"): ["plan", vl_src, "--gpus", 4, "--target", "sglang", "--json"]},
                       root, env=NO_FLAG))
    runs.update(run_cli_steps({(f, "validate"): ["validate", conv, "--against", src, "--json"] for f, (src, conv) in out.items()},
                       root))
    for f in FAMILIES:
        for step in ("synth", "convert"):
            assert runs[f, step].returncode == 0, runs[f, step].stderr
    return {**out, **runs, **{(f, "dir"): root for f in FAMILIES}}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_m31_converts_for_vllm_validates_against_its_source_and_is_refused_on_sglang(m31, family):
    src, conv = m31[family]
    ckpt = open_checkpoint(src)
    assert ckpt.format is FORMATS[M31] and "moe_quant_algo NVFP4" in ckpt.format_reason
    assert {p.weight.name.rsplit(".", 1)[1] for p in ckpt.projections} == {"weight_packed"}
    assert m31[family, "validate"].returncode == 0, m31[family, "validate"].stdout[-3000:]
    report = json.loads(m31[family, "validate"].stdout)
    assert report["summary"]["status"] == "pass" and report["summary"]["experts_checked"] == 16, report["summary"]
    assert {c["id"]: c["status"] for c in report["checks"]}["against.tensor_mismatch"] == "pass"
    # SGLang 0.5.23 builds MXFP8 experts for `quant_method: mxfp8` (core/targets/served.py REFUSED): the gate says so
    proc = m31[family, "sglang"]
    assert proc.returncode == 4 and "convert.unservable_family" in proc.stderr, proc.stderr
    assert "Fp8Config" in proc.stderr and "minimax_m3_nvfp4" in proc.stderr, proc.stderr
    assert not (m31[family, "dir"] / f"sglang-{family}").exists()


@pytest.mark.slow
def test_plan_gives_a_launch_command_only_where_the_release_serves_m31(m31):
    src, conv = m31["minimax-m3-vl"]
    for path, step in ((src, "vllm-src"), (conv, "vllm-conv")):
        vllm = m31["plan", step]
        assert vllm.returncode == 0, vllm.stdout[-2000:]
        plan = json.loads(vllm.stdout)
        assert plan["model"]["format"] == (M31 if path == src else "marlin") and plan["command"].startswith("vllm serve")
    sglang = m31["plan", "sglang"]
    plan = json.loads(sglang.stdout)
    assert sglang.returncode == 4 and plan["command"] is None and "Fp8Config" in plan["model"]["not_served"]["sglang"]


@pytest.mark.slow
def test_a_m31_block_with_another_expert_format_is_not_read_as_m31(m31):
    """The walk fails on a made-up variant: vLLM 0.34 refuses any `moe_quant_format` but nvfp4-pack-quantized
    ("Unsupported MXFP8 checkpoint MoE quantization"), and detection does not name the row for it."""
    ckpt = open_checkpoint(m31["minimax-m3"][0])
    assert detect_format(ckpt.config, None, ckpt.tensors)[0] is FORMATS[M31]
    for field, value in (("moe_quant_format", "mxfp4-pack-quantized"), ("moe_quant_algo", "MXFP8"),
                         ("quant_method", "fp8")):
        config = {**ckpt.config, "quantization_config": {**ckpt.config["quantization_config"], field: value}}
        with pytest.raises(ContentError, match="cannot tell the FP4 expert format"):
            detect_format(config, None, ckpt.tensors)


def _minimax_m3_like(*, total_gb: float = 250) -> Checkpoint:
    """nvidia/MiniMax-M3-NVFP4's expert shapes (module header): 57 MoE layers x 128 experts of w1/w3 [3072, 6144] and
    w2 [6144, 3072] in NVFP4 (U8 codes, E4M3 scales per 16), the rest of `total_gb` other weights."""
    hidden, inter, experts, moe_layers = 6144, 3072, 128, range(3, 60)
    tensors, projections = {}, []
    for layer in moe_layers:
        for e in range(experts):
            for role, w, (n, k) in ((Role.GATE, "w1", (inter, hidden)), (Role.UP, "w3", (inter, hidden)),
                                    (Role.DOWN, "w2", (hidden, inter))):
                key = f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}"
                wt = TensorRef(f"{key}.weight_packed", "s", "U8", (n, k // 2), 0, n * k // 2)
                sc = TensorRef(f"{key}.weight_scale", "s", "F8_E4M3", (n, k // 16), 0, n * k // 16)
                tensors[wt.name], tensors[sc.name] = wt, sc
                projections.append(Projection(key, str(layer), e, role, Quant.NVFP4, n, k, wt, sc))
    expert_bytes = sum(t.nbytes for t in tensors.values())
    other = TensorRef("model.embed_tokens.weight", "s", "BF16", (1,), 0, int(total_gb * 1e9) - expert_bytes)
    tensors[other.name] = other
    config = {"architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m2", "hidden_size": hidden,
              "intermediate_size": inter, "num_local_experts": experts, "num_hidden_layers": 60,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
              "quantization_config": {"quant_method": "mxfp8", "moe_quant_algo": "NVFP4",
                                      "moe_quant_format": "nvfp4-pack-quantized", "group_size": 16}}
    return Checkpoint(Path("MiniMax-M3"), FORMATS[M31], config, None, tensors, tuple(projections))


def test_250_gb_fit_4x96_at_tp4_from_the_experts_width():
    shape = shape_from_checkpoint(_minimax_m3_like())
    assert (shape.hidden, shape.intermediate, shape.experts) == (6144, 3072, 128)
    assert 231 < (shape.expert_bytes + shape.other_bytes) / GIB < 234  # 250 GB
    plan = make_plan(shape, gpus=4, gpu_mem_gib=96, engine="vllm")
    by = {(c.tp, c.ep): c for c in plan.candidates}
    assert by[(4, 1)].tiles.ok and by[(4, 1)].fits  # I/4 = 768 (6 x 128), H = 6144: no padding
    assert not by[(2, 1)].fits and not by[(1, 1)].fits  # 116 GiB / 233 GiB of weights per GPU
    assert (plan.chosen.tp, plan.chosen.ep) == (4, 1) and plan.command.startswith("vllm serve")
    assert plan.chosen.weights_gib == pytest.approx(233 / 4, abs=1)
    assert not make_plan(shape, gpus=2, gpu_mem_gib=96, engine="vllm").chosen  # 2 x 96 GB: nothing fits
