"""`validate --kernel` on a replica of every synth model family, for both targets, with the engine's real
Marlin kernels of the vLLM release named by DSV4_MARLIN_MODULE (tests/gpu/run.sh runs the suite once with
vLLM 0.33.0's build and once with 0.34.0's: their op schemas differ, 26 vs 25 GEMM arguments).

Substitutions: the engine is the test build of vLLM's Marlin kernels (../shared/marlin-kernels[-0.34],
sources unchanged; the device has no vLLM), loaded through --kernel-provider module:PATH; or SGLang 0.5.23's own JIT ops
(--kernel-provider sglang, the test build of its wheel's sources: tests/gpu/run.sh VERSIONS=sglang).
Sources are `dsv4-convert synth --family F --format X` replicas (real names and configs, shrunk sizes),
converted by the real CLI; `--allow-unservable` only where the converter's gate refuses the family.
Qwen3.8-Flash-Next (qwen4-exp: FP8 or NVFP4 PLE n-gram tables beside the experts) runs its routed experts alone.
Nemotron-H (non-gated relu2 experts, served) runs w13 as the up projection alone (N = I), w2, and each layer
whole: w13, ReLU-squared in bf16, w2 on every (token, expert) row, as the engines' fused_marlin_moe chains them.
GLM-5.3-Flash (gated, its SwiGLU clamped at `swiglu_limit`) runs each layer whole with that clamped SwiGLU too.
A group's command lines run in one CLI process each step (run_cli_batch): the tests then read the reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4_convert.runtime.settings import ALLOW_UNSERVABLE_ENV
from dsv4_convert.synth import SYNTH_FAMILIES
from tests.helpers.cli import run_cli_batch, succeeded
from tests.helpers.kernel_cli import (
    KERNELS,
    PROVIDER,
    TARGETS,
    kernel_args,
    kernel_report,
    needs_kernels,
    record,
    status,
)

pytestmark = needs_kernels

# The module's cases run in groups of about a quarter each (target x half of the families), one xdist worker a
# group (run.sh: --dist loadgroup): a group's first test synthesises, converts and validates the whole group in
# two CLI processes (_Reports). One group for all (one worker, 8 CLI processes at a time) took over 220 s on the
# 16-core box; a fixture built by each of 14 workers started 112 CLI processes at once (load 350-400, issue 36).
_HALF = {family: i % 2 for i, family in enumerate(SYNTH_FAMILIES)}


def _group(family: str, target: str) -> str:
    return f"families-{target}-{_HALF[family]}"


def params(*cases: tuple) -> list:
    """pytest params of (family, ..., target) tuples, each marked with its group."""
    return [pytest.param(*c, marks=pytest.mark.xdist_group(_group(c[0], c[-1]))) for c in cases]


def on_targets(*cases) -> list:
    """params of each case (a family name, or a tuple starting with one) on every target under test."""
    return params(*((*((c,) if isinstance(c, str) else c), t) for c in cases for t in TARGETS))


CASES = [(family, fmt, target) for family, formats in SYNTH_FAMILIES.items() for fmt in formats
         for target in TARGETS]
# synth sizes a family's replica needs: Kimi-K3's experts run at the latent width H / 2, which vLLM's MXFP4 MoE takes
# unpadded from 256 (serving_tests/differential.py's h512 edit, the differential proof's size)
SYNTH_ARGS = {"kimi-k3": ("--hidden", "512")}


def _convert_args(root: Path, family: str, fmt: str, target: str) -> list:
    cmd = "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"
    return [cmd, root / f"src-{family}-{fmt}", root / f"out-{family}-{fmt}-{target}", "--target", target,
            "--act-dtype", "bfloat16", "-q"]


class _Reports(dict):
    """(family, format, target) -> (unservable, validate --kernel report), built a group at a time on first use, in
    two CLI processes (run_cli_batch): the synths and each conversion with the gate as a user meets it (tests/conftest.py
    lifts it: DSV4_CONVERT_ALLOW_UNSERVABLE=0 here), then the refused ones with --allow-unservable and the kernels."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, case):
        group = [c for c in CASES if _group(c[0], c[2]) == _group(case[0], case[2])]
        root = self.root / _group(case[0], case[2])
        root.mkdir(parents=True, exist_ok=True)
        synths = [["synth", root / f"src-{f}-{x}", "--family", f, "--format", x, *SYNTH_ARGS.get(f, ()), "-q"]
                  for f, x in sorted({(f, x) for f, x, _ in group})]  # one a source: conversions never race for it
        answers = run_cli_batch([*synths, *(_convert_args(root, *c) for c in group)], root,
                                env={ALLOW_UNSERVABLE_ENV: "0"})
        for proc in answers[:len(synths)]:
            succeeded(proc)
        unservable = {c: proc.returncode != 0 for c, proc in zip(group, answers[len(synths):])}
        for c, proc in zip(group, answers[len(synths):]):
            assert proc.returncode == 0 or "--allow-unservable" in proc.stderr, proc.stderr[-2000:]
        refused = [c for c in group if unservable[c]]
        kernels = [kernel_args(root / f"out-{f}-{x}-{t}", PROVIDER, "--against", root / f"src-{f}-{x}")
                   for f, x, t in group]
        answers = run_cli_batch([*(_convert_args(root, *c) + ["--allow-unservable"] for c in refused), *kernels], root)
        for proc in answers[:len(refused)]:
            succeeded(proc)
        self.update({c: (unservable[c], kernel_report(proc)) for c, proc in zip(group, answers[len(refused):])})
        return self[case]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return _Reports(tmp_path_factory.mktemp("families"))


@pytest.mark.slow
@pytest.mark.parametrize("family,fmt,target", params(*CASES))
def test_every_family_passes_the_engines_kernel(reports, family, fmt, target):
    unservable, data = reports[(family, fmt, target)]
    gemm, repack = status(data, "kernel.gemm"), status(data, "kernel.repack")
    # the kernel's verdict; another check may report an error of its own (an --allow-unservable family's
    # output fails the serving pre-flight, marlin.serving_methods): recorded, not this test's question
    errors = [f["message"] for f in data["findings"] if f["severity"] == "error" and f["check"].startswith("kernel.")]
    record(suite="families", kernels=KERNELS, family=family, format=fmt, target=target,
           unservable=unservable, gemm=gemm, repack=repack, stacks=len(data["kernel"]),
           other_errors=sorted({f["check"] for f in data["findings"] if f["severity"] == "error"} - {"kernel.gemm", "kernel.repack"}),
           max_rel_error=max((r["max_rel_error"] or 0.0 for r in data["kernel"]), default=None))
    assert data["kernel"], "no expert stack ran through the kernel"
    assert (gemm, repack) == ("pass", "pass") and not errors, (gemm, repack, errors)


@pytest.mark.slow
@pytest.mark.parametrize("replica,target", on_targets("nemotron-h", "nemotron-3-super"))  # Nano; Super / Ultra (latent)
def test_nemotron_h_non_gated_layers_run_through_the_engines_kernels(reports, replica, target):
    """Served (no --allow-unservable), and every MoE layer ran three cases: the one-shard w13, w2, and the whole
    layer with the engines' relu2 activation, each within its limit (kernel.gemm passes)."""
    unservable, data = reports[(replica, "nvfp4-modelopt-hf", target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    layers = {layer for layer, _ in rows}
    record(suite="families-nemotron", kernels=KERNELS, replica=replica, target=target,
           rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]] for k, r in sorted(rows.items())])
    assert not unservable
    assert layers and set(rows) == {(layer, p) for layer in layers for p in ("w13", "w2", "w13+relu2+w2")}, rows
    assert all(r["experts"] == 8 and r["max_rel_error"] <= r["limit"] for r in rows.values()), rows
    assert status(data, "kernel.gemm") == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("family,target", on_targets("deepseek-v41"))
def test_deepseek_v41_trunk_and_dspark_stages_run_through_the_engines_kernels(reports, family, target):
    """Served (no --allow-unservable); the trunk's layers and the three DSpark stages, each stage with its own
    expert count (`dspark_n_routed_experts`, fewer than the trunk's: synth/dsv41.py), ran w13 and w2 through the
    kernel with DeepSeek's SwiGLU limits and passed."""
    unservable, data = reports[(family, "mxfp4-dsv4", target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    experts = {}
    for (layer, _), r in rows.items():
        experts.setdefault(layer, set()).add(r["experts"])
    record(suite="families-deepseek-v41", kernels=KERNELS, target=target,
           rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]] for k, r in sorted(rows.items())])
    assert not unservable
    assert {"mtp.0", "mtp.1", "mtp.2"} <= set(experts) and len(set(experts) - {"mtp.0", "mtp.1", "mtp.2"}) >= 2
    trunk = {n for layer, ns in experts.items() if not layer.startswith("mtp") for n in ns}
    # synth's default 8 experts a trunk layer: dspark_n_routed_experts 4 (synth/dsv41.py draft_experts)
    assert all(ns == {4} for layer, ns in experts.items() if layer.startswith("mtp")) and min(trunk) > 4, experts
    assert status(data, "kernel.gemm") == "pass" and status(data, "kernel.repack") == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("family,fmt,target", on_targets(("kimi-k3", "mxfp4-ct"), ("kimi-k3", "nvfp4-ct")))
def test_kimi_k3_latent_experts_run_through_the_engines_kernels(reports, family, fmt, target):
    """Kimi-K3's routed experts (latent width, synth/kimi_k3.py) ran w13, w2 and the whole layer with the engines' SiTU
    (validate/kernel_moe.py situ, the replica's betas 4.0 / 25.0) through the kernel, each within its limit; served on
    vLLM, refused on SGLang 0.5.23 (core/targets/served.py REFUSED: converted with --allow-unservable there)."""
    unservable, data = reports[(family, fmt, target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    record(suite="families-kimi-k3", kernels=KERNELS, format=fmt, target=target,
           rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]] for k, r in sorted(rows.items())])
    assert unservable == (target == "sglang")
    layers = {layer for layer, _ in rows}
    assert layers and set(rows) == {(layer, p) for layer in layers for p in ("w13", "w2", "w13+situ+w2")}, rows
    assert all(r["max_rel_error"] <= r["limit"] for r in rows.values()), rows
    assert status(data, "kernel.gemm") == "pass" and status(data, "kernel.repack") == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("family,fmt,target", on_targets(("glm5-next", "nvfp4-modelopt-hf"), ("glm5-next", "nvfp4-ct"),
                                                         ("glm5-next-vl", "nvfp4-modelopt-hf"), ("glm5-next-vl", "nvfp4-ct")))
def test_glm5_next_layers_run_with_the_engines_clamped_swiglu(reports, family, fmt, target):
    """GLM-5.3-Flash (served, no --allow-unservable, but the text model on SGLang: core/targets/served.py REFUSED, converted
    with --allow-unservable there; the kernel still runs): each MoE layer ran w13 (gate | up), w2, and the whole layer with
    the engines' SwiGLU clamped at the config's swiglu_limit (validate/kernel_moe.py swiglu_limited; the input scaled
    so that the clamp is reached), each within its limit. The MTP layer's BF16 experts are copied, not run."""
    unservable, data = reports[(family, fmt, target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    record(suite="families-glm5-next", kernels=KERNELS, family=family, format=fmt, target=target,
           rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]] for k, r in sorted(rows.items())])
    assert unservable == (family == "glm5-next" and target == "sglang")  # SGLang 0.5.23 registers the VL class alone
    layers = {layer for layer, _ in rows}
    assert layers and set(rows) == {(layer, p) for layer in layers for p in ("w13", "w2", "w13+swiglu_limit+w2")}, rows
    assert all(r["max_rel_error"] <= r["limit"] for r in rows.values()), rows


@pytest.mark.slow
@pytest.mark.parametrize("replica,fmt,target", on_targets(("minimax-m3", "nvfp4-ct-mxfp8"), ("minimax-m3", "nvfp4-modelopt-hf"),
                                                          ("minimax-m3-vl", "nvfp4-ct-mxfp8")))
def test_minimax_m3_layers_run_whole_with_the_clamped_swiglu(reports, replica, fmt, target):
    """MiniMax-M3 / M3.1: every MoE layer ran w13 (gate | up), w2 and the whole layer with the clamped SwiGLU-OAI its
    config declares (family activation `swigluoai-limit`; swiglu_alpha 1.702, swiglu_limit 7.0: structure.py
    swiglu_alpha / swiglu_limit), each within its limit. M3.1 on SGLang is not served (--allow-unservable): the kernel
    still runs."""
    unservable, data = reports[(replica, fmt, target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    layers = {layer for layer, _ in rows}
    record(suite="families-minimax-m3", kernels=KERNELS, replica=replica, format=fmt, target=target,
           unservable=unservable, rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]]
                                        for k, r in sorted(rows.items())])
    assert unservable == (fmt == "nvfp4-ct-mxfp8" and target == "sglang")
    assert layers and set(rows) == {(layer, p) for layer in layers for p in ("w13", "w2", "w13+swiglu_limit+w2")}, rows
    assert all(r["experts"] == 8 and r["max_rel_error"] <= r["limit"] for r in rows.values()), rows
    assert status(data, "kernel.gemm") == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("replica,target", on_targets("qwen4-exp", "qwen4-exp-ple-nvfp4"))  # FP8 / NVFP4 PLE tables
def test_qwen4_exp_routed_experts_alone_run_through_the_engines_kernels(reports, replica, target):
    """Qwen3.8-Flash-Next (SiLU-gated experts, the engines' plain SwiGLU: Qwen3-Next's MoE block): both MoE layers'
    routed experts, 8 each, ran w13 and w2 through the kernel and passed; the NVFP4 n-gram tables and the NVFP4 shared
    expert (no routed experts: copied as they are) are not among the stacks."""
    _, data = reports[(replica, "nvfp4-modelopt-hf", target)]
    rows = {(r["layer"], r["projection"]): r for r in data["kernel"]}
    record(suite="families-qwen4-exp", kernels=KERNELS, replica=replica, target=target,
           rows=[[k[0], k[1], r["experts"], r["max_rel_error"], r["limit"]] for k, r in sorted(rows.items())])
    assert {str(layer) for layer, _ in rows} == {"0", "1"} and all(r["experts"] == 8 for r in rows.values()), rows
    assert status(data, "kernel.gemm") == "pass" and status(data, "kernel.repack") == "pass"
