"""`dsv4-convert validate`: pre-flight checks of a source or converted checkpoint (docs/VALIDATE.md)."""

from __future__ import annotations

import sys

import click

from ..core.errors import UsageError
from ..core.targets.engines import ACT_DTYPES, DEFAULT_ENGINE
from ..core.targets.target import MarlinTarget
from ..runtime.executors import refuse_device
from ..validate.inputs import Options
from ..validate.kernel_provider import providers
from ..validate.runner import Unreadable
from ..validate.runner import validate as run_validation
from .kernel_opts import kernel_options, refuse_unsupported_shapes, run_kernel_checks
from .options import ACT_DTYPE_CHOICE, SEED, TARGET_CHOICE, TARGET_HELP, W4A8_ENGINE, executor_options
from .report import emit, progress_option, report_options, show_progress

__all__ = ["validate"]

EXAMPLES = """

\b
Examples:
  dsv4-convert validate ./DeepSeek-V4-Flash --target sglang --tp 8
  dsv4-convert validate ./dsv4-marlin --against ./DeepSeek-V4-Flash-NVFP4 --report report.json
  dsv4-convert validate ./dsv4-marlin --json | jq .summary
  dsv4-convert validate ./dsv4-marlin --sample 0.1 --plot layers.png

\b
Exit codes: 0 clean, 1 errors found (warnings too with --strict), 2 usage error, unreadable input or
a report that cannot be written, 130 interrupted (Ctrl-C, SIGTERM, SIGHUP). Every path, failures
included, prints one JSON object with --json (docs/ERRORS.md).
"""


def _fraction(ctx, param, value):
    if not 0 < value <= 1:
        raise click.BadParameter(f"must be in (0, 1], got {value}")
    return value


@click.command(help="Check a checkpoint before you launch it: structure, numerics, Marlin layout round trip "
                    "and a GEMM spot check. Full by default (every block of every expert)." + EXAMPLES)
@click.argument("path")
@click.option("--against", "against", metavar="SRC", help="reference source checkpoint: compare byte for byte")
@click.option("--target", type=TARGET_CHOICE, default=None,
              help=f"engine that will serve it: {TARGET_HELP} [default: {DEFAULT_ENGINE}, or what a converted "
                   "checkpoint records]")
@click.option("--act-dtype", type=ACT_DTYPE_CHOICE, default=None,
              help=f"activation dtype [default: {ACT_DTYPES[0]}, or what a converted checkpoint records]")
@click.option("--w4a8", is_flag=True, help="MXFP4 with FP8 activations (vLLM only)")
@click.option("--tp", default=None, type=click.IntRange(min=1),
              help="tensor-parallel size [default: 1, or the tp_layout a --tp conversion records]")
@click.option("--ep", default=None, type=click.IntRange(min=1),
              help="expert-parallel size [default: 1, or the tp_layout a --tp conversion records]")
@click.option("--sample", default=1.0, show_default=True, type=float, callback=_fraction,
              help="fraction of each layer's experts to check (1 = all)")
@click.option("--gemm-experts", default=2, show_default=True, type=click.IntRange(min=0),
              help="experts per layer for the GEMM spot check")
@click.option("--seed", default=0, show_default=True, type=SEED, help="seed for sampling and GEMM activations")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="worker processes (the checks are light: more than 1 helps only on many cores) [default: 1]")
@click.option("--kernel", is_flag=True,
              help="also run the engine's own Marlin kernels on this GPU (MoE GEMM against an fp32 reference, "
                   "repack against the source bytes); see docs/VALIDATE.md")
@click.option("--kernel-experts", default="all", show_default=True, metavar="N|all",
              help="experts per layer for --kernel (chosen deterministically from --seed)")
@click.option("--kernel-provider", default="auto", show_default=True, metavar="|".join((*providers()[:-1], "module:PATH")),
              help="whose kernels --kernel runs: the installed engine, or a built extension")
@click.option("--device", default=None, metavar="cuda[:N]", help="GPU for --kernel [default: cuda]")
@click.option("--plot", "plot_file", metavar="FILE", help="per-layer heat map PNG (needs matplotlib)")
@click.option("--no-verify-manifest", "skip_manifest", is_flag=True,
              help="skip re-hashing the files a converted checkpoint's manifest lists (faster)")
@click.option("--strict", is_flag=True, help="warnings fail too (exit 1)")
@report_options
@progress_option
@executor_options
@click.pass_context
def validate(ctx, path, against, target, act_dtype, w4a8, tp, ep, sample, gemm_experts, seed, workers, kernel,
             kernel_experts, kernel_provider, device, plot_file, skip_manifest, strict, as_json, report_file, quiet,
             force_progress, executor):
    refuse_device(executor, device if kernel else None)
    layout_requested = tp is not None or ep is not None
    tp, ep = tp or 1, ep or 1
    if tp % ep:
        raise click.BadParameter(f"--ep {ep} must divide --tp {tp} (the MoE runs with TP / EP per expert)",
                                 param_hint="--ep")
    if w4a8 and target not in (None, W4A8_ENGINE):
        raise click.BadParameter(f"W4A8 exists only in {W4A8_ENGINE}'s Marlin; drop --w4a8 or use --target "
                                 f"{W4A8_ENGINE}", param_hint="--w4a8")
    try:
        served_with = MarlinTarget(target or (W4A8_ENGINE if w4a8 else DEFAULT_ENGINE), act_dtype or ACT_DTYPES[0], w4a8)
    except ValueError as e:
        raise UsageError(str(e), error_id="usage.target") from None
    opts = Options(target=served_with, tp=tp, ep=ep, sample=sample, gemm_experts=gemm_experts, seed=seed, engine_requested=target,
                   act_dtype_requested=act_dtype, verify_manifest=not skip_manifest, layout_requested=layout_requested)
    if kernel:  # a shape the engine's kernel cannot run is refused before any work, GPU or not
        refuse_unsupported_shapes(path, opts, against)
    kernel_opts = kernel_options(kernel, kernel_experts, kernel_provider, device)
    try:
        report = run_validation(path, opts, against=against, workers=workers or 1,
                                progress=show_progress(quiet, force_progress), executor=executor)
    except Unreadable as e:
        raise e.error from None  # main() maps it: exit 2 for validate, its JSON object with --json
    if kernel_opts is not None:
        run_kernel_checks(path, opts, report, against=against, kopts=kernel_opts)
    if plot_file:  # before the report: a plot that fails is then the one error object under --json
        from ..validate.plot import plot_report
        click.echo(plot_report(report, plot_file), err=True)
    emit(report.to_json(strict=strict), report.render_text(strict=strict, quiet=quiet), as_json=as_json,
         report_file=report_file, quiet=False, exit_code=report.exit_code(strict=strict))  # -q keeps the findings
    sys.exit(report.exit_code(strict=strict))
