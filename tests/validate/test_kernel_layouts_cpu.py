"""`validate --kernel` without a GPU: what the runner hands the kernel (padded per-rank layouts, the
engine's padding of a source, refused shapes) and the severity policy of kernel.gemm.

Substitutions: CI has no GPU and no engine. The runner's preparation (validate/kernel_runner.py) runs
on the CPU device, and the engine's gptq_marlin_repack is replaced by the project's CPU codec
(formats/marlin/weight.to_marlin_weight, byte-equal to the engines' repack in tests/golden); the GPU
suite (tests/gpu/test_kernel_layouts_gpu.py) runs the same paths through vLLM's real kernels. The
severity policy is tested on KernelCase values (the numbers the kernel would give), since it is a pure
function of them. Checkpoints are synth's (in process) converted by the real CLI (the shared ones in one CLI process,
run_cli_batch: `main(argv)` each, as the console script runs it); refusals run the real CLI.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv4_convert.core.checkpoint.reader import TensorReader, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin.weight import to_marlin_weight
from dsv4_convert.synth import write_synthetic_checkpoint
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks.kernel import KernelCase, kernel_gemm
from dsv4_convert.validate.inputs import Options
from dsv4_convert.validate.kernel_runner import _Layer
from dsv4_convert.validate.kernel_shapes import kernel_layouts
from dsv4_convert.validate.runner import rescale_factors, resolve_options
from tests.helpers.cli import run_cli as cli
from tests.helpers.cli import run_cli_batch


class CpuRepack:
    """The engine's gptq_marlin_repack(b_q_weight int32 [K/8, N], size_k, size_n, num_bits=4), called by its
    schema's argument names as validate/kernel_provider.py calls it, by the project's CPU codec."""
    name = "cpu codec"
    repack_op = to_marlin_weight  # the runner asks whether the provider has a repack op

    def repack(self, *, b_q_weight, size_k, size_n, num_bits, perm=None, is_a_8bit=False):
        assert (num_bits, is_a_8bit) == (4, False) and tuple(b_q_weight.shape) == (size_k // 8, size_n)
        assert perm is None or perm.numel() == 0  # no act-order permutation (SGLang's repack takes one)
        return to_marlin_weight(b_q_weight.t().contiguous().view(torch.uint8))


# (format, target, act dtype, synth sizes, tp, ep): padded layouts small enough for the CPU suite
PADDED = {
    "nvfp4-I256-tp8-vllm": ("nvfp4-modelopt-dsv4", "vllm", "bfloat16", {"intermediate": 256}, 8, 1),
    "mxfp4-I256-tp8-sglang": ("mxfp4-dsv4", "sglang", "bfloat16", {"intermediate": 256}, 8, 1),
    "mxfp4-I256-tp8-ep2-vllm": ("mxfp4-dsv4", "vllm", "bfloat16", {"intermediate": 256}, 8, 2),
    # gpt-oss-shaped: H and I_shard both padded (320 -> 512, 160 -> 256); H = I = 2880 runs in tests/gpu
    "gptoss-H320-tp2-vllm": ("mxfp4-gptoss", "vllm", "bfloat16", {"hidden": 320, "intermediate": 320}, 2, 1),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """case -> (its source, its conversion): the conversions in one CLI process (run_cli_batch)."""
    root, out, commands = tmp_path_factory.mktemp("padded"), {}, []
    for case, (fmt, target, act, sizes, tp, ep) in PADDED.items():
        src, dst = root / f"{case}-src", root / f"{case}-out"
        write_synthetic_checkpoint(src, format=fmt, layers=1, experts=2, **sizes)
        cmd = "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"
        commands.append([cmd, src, dst, "--target", target, "--act-dtype", act, "--tp", tp, "--ep", ep, "-q"])
        out[case] = (src, dst)
    for proc in run_cli_batch(commands, root):
        assert proc.returncode == 0, (proc.args, proc.stderr)
    return out


def _prepared(path: Path, opts: Options, against: Path | None = None) -> dict:
    """key -> the runner's _Prepared of every projection (the owner of up is the gate), on the CPU."""
    ckpt = open_checkpoint(path)
    opts = resolve_options(opts, ckpt)
    ref = open_checkpoint(against) if against is not None else None
    layouts = kernel_layouts(ckpt, opts, ref)
    by_expert = {(p.layer, p.expert, p.role): p for p in ckpt.projections}
    with TensorReader(ckpt.root) as r, TensorReader(ref.root if ref else ckpt.root) as rr:
        sf = rescale_factors(ckpt, opts, r, ckpt.projections)
        layer = _Layer(ckpt, r, {p.key: p for p in ref.projections} if ref else {}, rr, ref.format if ref else None,
                       opts, CpuRepack(), sf, torch.device("cpu"), layouts)
        return {p.key: layer.prepare(p, by_expert.get((p.layer, p.expert, Role.GATE), p) if p.role is Role.UP else p)
                for p in ckpt.projections}


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
@pytest.mark.parametrize("case", sorted(PADDED))
def test_against_reference_is_the_padded_layout(converted, case):
    """With --against, the reference and the repack input are the source padded per rank: they equal
    the decode of clean bytes exactly, and the engine's repack gives the stored words."""
    src, out = converted[case]
    against, decoded = _prepared(out, Options(), src), _prepared(out, Options())
    for key, a in against.items():
        assert a.repack[0] == 0, (key, a.repack)
        assert torch.equal(a.ref, decoded[key].ref), key


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
@pytest.mark.parametrize("case", sorted(PADDED))
def test_source_is_prepared_as_the_converter_writes_that_split(converted, case):
    """An unconverted source at the output's --tp/--ep runs padded as the engine pads it: the prepared
    Marlin words and scales are the converted output's bytes."""
    fmt, target, act, _, tp, ep = PADDED[case]
    src, out = converted[case]
    prepared = _prepared(src, Options(target=MarlinTarget(engine=target, act_dtype=act), tp=tp, ep=ep))
    ckpt = open_checkpoint(out)
    files = {f: load_file(ckpt.root / f) for f in {p.weight.file for p in ckpt.projections}}
    for p in ckpt.projections:
        got = prepared[p.key]
        assert torch.equal(got.q, files[p.weight.file][p.weight.name]), p.key
        stored = files[p.scale.file][p.scale.name]
        assert torch.equal(got.s.view(torch.uint8), stored.view(torch.uint8)), p.key
        assert got.repack[0] == 0


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
def test_swapped_rank_blocks_differ_from_the_against_reference_only(converted, tmp_path):
    src, out = converted["mxfp4-I256-tp8-ep2-vllm"]
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", out, broken], check=True)
    i_pad = json.loads((out / "config.json").read_text())["quantization_config"]["tp_layout"]["containers"]
    i_pad = next(iter(i_pad.values()))["i_pad"]
    p = next(p for p in open_checkpoint(broken).projections if p.expert == 1 and p.role is Role.DOWN)
    tensors = load_file(broken / p.weight.file)
    for name, rows in ((p.weight.name, i_pad // 16), (p.scale.name, i_pad // 32)):  # down: ranks along K (rows)
        t = tensors[name]
        tensors[name] = torch.cat((t[rows:2 * rows], t[:rows], t[2 * rows:]))
    (broken / p.weight.file).chmod(0o644)
    save_file(tensors, broken / p.weight.file, metadata={"format": "pt"})
    against, decoded = _prepared(broken, Options(), src), _prepared(broken, Options())
    assert against[p.key].repack[0] > 0 and not torch.equal(against[p.key].ref, decoded[p.key].ref)
    clean = _prepared(out, Options())
    assert not torch.equal(decoded[p.key].ref, clean[p.key].ref)  # decoded follows the bytes: blind to it


# --------------------------------------------------------------------------------- severity policy
def _case(rel, engine_global=None, act="float16"):
    c = KernelCase("2", "w2", act, "vllm 0.33.0", "--against SRC", rel={0: rel},
                   names={0: ("layers.2.ffn.experts.0.w2.weight", "model-00001.safetensors")})
    if engine_global is not None:
        c.engine_global[0] = engine_global
    return c


def test_a_breach_the_engines_own_global_rounding_explains_is_a_warning_naming_the_cause():
    (f,) = kernel_gemm(_case(2.6e-3, (1.003, 2.2e-4)), None)
    assert f.severity is Severity.WARNING and f.cause == "nvfp4.global.range" and f.value == 2.6e-3
    assert "0.30% off" in f.message and "the engine's own rounding" in f.message


@pytest.mark.parametrize("engine_global", [None, (1.003, 2.5e-3), (0.0, 0.0), (float("inf"), float("nan"))],
                         ids=["no-rounding", "beyond-the-rounding", "flushed-to-zero", "overflowed"])
def test_an_error_the_rounding_does_not_explain_stays_an_error(engine_global):
    (f,) = kernel_gemm(_case(2.6e-3, engine_global), None)
    assert f.severity is None and f.cause is None  # the check's own severity: error
    assert ("does not explain it" in f.message) == (engine_global is not None)


def test_within_the_limit_nothing_is_reported():
    assert list(kernel_gemm(_case(1.9e-3, (1.003, 1e-4)), None)) == []


# ------------------------------------------------------------------------------------ refusals
def _refused(*args) -> dict:
    proc = cli("validate", *args, "--kernel", "--json", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)["error"]


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
def test_a_source_no_engine_padding_serves_is_refused_before_any_work(tmp_path):
    """SGLang never pads a gated NVFP4 MoE: I = 96 breaks the tile rule (was a traceback, exit 1)."""
    write_synthetic_checkpoint(tmp_path / "src", layers=1, experts=2, intermediate=96)
    err = _refused(tmp_path / "src", "--target", "sglang")
    assert err["id"] == "kernel.shape_unsupported" and err["tensor"] == "layers.0.ffn.experts"
    assert "sglang does not pad a gated nvfp4 MoE" in err["message"] and "plan" in err["fix"]


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
@pytest.mark.parametrize("fmt,engine,tp,ep,verdict", [
    ("nvfp4-modelopt-dsv4", "sglang", 1, 1, "refused"),  # SGLang never pads a gated NVFP4 MoE
    ("nvfp4-modelopt-dsv4", "vllm", 1, 1, 128),  # vLLM pads I 96 -> 128
    ("mxfp4-dsv4", "sglang", 1, 1, 128),
    ("mxfp4-dsv4", "vllm", 8, 1, "refused"),  # I_shard 12: a quant group would straddle two ranks
    ("mxfp4-dsv4", "vllm", 2, 2, 128),  # EP 2 keeps experts whole: MoE TP 1
])
def test_kernel_layouts_pad_as_the_engine_pads_or_refuse(tmp_path, fmt, engine, tp, ep, verdict):
    ckpt = open_checkpoint(write_synthetic_checkpoint(tmp_path / "src", format=fmt, layers=1, experts=2,
                                                      intermediate=96))
    opts = replace(Options(), target=MarlinTarget(engine), tp=tp, ep=ep)
    if verdict == "refused":
        with pytest.raises(ContentError) as e:
            kernel_layouts(ckpt, opts)
        assert e.value.error_id == "kernel.shape_unsupported" and e.value.exit_code == 4
    else:
        assert kernel_layouts(ckpt, opts)["layers.0.ffn.experts"].i_pad == verdict


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
def test_a_converted_shape_off_the_tile_rule_is_refused(tmp_path):
    """A Marlin checkpoint whose w2 has K = 96 (not written by this tool): the kernel would read out of bounds."""
    write_synthetic_checkpoint(tmp_path / "src", format="mxfp4-dsv4", layers=1, experts=2)
    cli("mxfp4-to-marlin", tmp_path / "src", tmp_path / "out", "--target", "vllm", "-q")
    ckpt = open_checkpoint(tmp_path / "out")
    for p in (p for p in ckpt.projections if p.role is Role.DOWN):
        f = ckpt.root / p.weight.file
        t = load_file(f)
        t[p.weight.name], t[p.scale.name] = t[p.weight.name][:96 // 16], t[p.scale.name][:96 // 32]
        f.chmod(0o644)
        save_file(t, f, metadata={"format": "pt"})
    err = _refused(tmp_path / "out", "--no-verify-manifest")
    assert err["id"] == "kernel.shape_unsupported" and "w2 stack N=256, K=96" in err["message"]


@pytest.mark.slow  # starts the CLI or writes and converts checkpoints
def test_an_against_of_another_shape_is_refused(converted, tmp_path):
    _, out = converted["mxfp4-I256-tp8-sglang"]
    write_synthetic_checkpoint(tmp_path / "other", format="mxfp4-dsv4", layers=1, experts=2)  # I = 128
    err = _refused(out, "--against", tmp_path / "other")
    assert err["id"] == "kernel.against_shape" and "[128, 256]" in err["message"]
