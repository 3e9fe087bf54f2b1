"""Options shared by several commands, spelled the same way everywhere."""

from __future__ import annotations

import functools
import re

import click

from ..core.errors import UsageError
from ..core.targets.engines import ACT_DTYPES, DEFAULT_ENGINE, ENGINES
from ..core.version import install_command
from ..runtime.executors import EXECUTORS, ExecutorSpec
from .report import progress_option, report_options

__all__ = ["ACT_DTYPE_CHOICE", "TARGET_CHOICE", "TARGET_HELP", "W4A8_ENGINE", "target_options", "run_options", "executor_options", "parse_size", "device_option", "refuse_gpu_device", "FiniteFloat", "SEED"]

# a seed torch's generator takes (it raises on anything wider than 64 bits)
SEED = click.IntRange(-(2**63), 2**64 - 1)


class FiniteFloat(click.FloatRange):
    """A float option with a lower bound that refuses nan and inf (click's FloatRange lets nan through:
    every comparison with nan is false)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def parse_size(value: str | int | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", value, re.IGNORECASE)
    if not m:
        raise click.BadParameter(f"{value!r} is not a size; use e.g. 5GB, 500MiB or a byte count")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    factor = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit]
    return int(float(m.group(1)) * factor)


# --target and --act-dtype of every command: the choices and the versions in the help come from the
# engine-facts table (core/targets/engines.py), never typed here
TARGET_CHOICE = click.Choice(sorted(ENGINES))
ACT_DTYPE_CHOICE = click.Choice(ACT_DTYPES)
TARGET_HELP = ", ".join(f"{name} = {ENGINES[name].describe()}" for name in sorted(ENGINES))
W4A8_ENGINE = next(name for name, facts in ENGINES.items() if facts.w4a8)  # the one engine with a W4A8 Marlin


def target_options(fn):
    fn = click.option("--act-dtype", type=ACT_DTYPE_CHOICE, default=ACT_DTYPES[0], show_default=True,
                      help="Activation dtype the server will run with. NVFP4 bytes depend on it; MXFP4 needs bfloat16.")(fn)
    fn = click.option("--target", type=TARGET_CHOICE, default=DEFAULT_ENGINE, show_default=True,
                      help=f"Engine layout: {TARGET_HELP}.")(fn)
    return fn


def run_options(fn):
    for opt in reversed([
        click.option("--workers", type=click.IntRange(1), default=None, show_default="number of cores",
                     help="Processes converting in parallel; with more workers than "
                          "shards, each shard is split into pieces written side by side. By default, shards "
                          "at least half as many as the cores stay whole (one worker each: a split shard is "
                          "hashed again at the end), and small inputs run in one process."),
        click.option("--max-shard-size", default=None, metavar="SIZE",
                     help="Re-shard the output (e.g. 5GB). Default: keep the input's shards."),
        click.option("--resume", is_flag=True, help="Continue an interrupted run; finished shards whose hash verifies are kept."),
        click.option("--force", is_flag=True, help="Replace an existing OUT (published only when the new one is complete)."),
        click.option("--dry-run", is_flag=True, help="Print the plan (tensors, bytes, output size) and write nothing."),
    ]):
        fn = opt(fn)
    return report_options(progress_option(fn))


def device_option(fn):
    """The converters' --device: cpu only. The GPU route was withdrawn (docs/PERFORMANCE.md): on an H100
    box it ran at 0.39x the CPU route with the same bytes (the GPU takes only the weight repack; reading,
    writing, start-up and two PCIe copies stay). Kept, hidden, so that `--device cpu` in scripts still works."""
    return click.option("--device", default="cpu", hidden=True, metavar="cpu")(fn)


def refuse_gpu_device(device: str | None) -> None:
    """Check the converters' --device: `cpu` (the default) is the only route; anything else (`cuda`,
    `cuda:N`) is refused with the reason, before anything is read or written (scripts still pass it)."""
    if (device or "cpu").strip().lower() == "cpu":
        return
    raise UsageError(f"--device {device}: the converters run on the CPU only; the GPU route was withdrawn because "
                     "it was slower (0.39x the CPU route on an H100 box, same bytes)",
                     error_id="usage.device_withdrawn",
                     hint="drop --device; docs/PERFORMANCE.md has the measurements")


def executor_options(fn):
    """--executor / --ray-address, handed to the command as one `executor=ExecutorSpec`."""
    @functools.wraps(fn)
    def wrapper(*args, executor: str, ray_address: str | None, **kwargs):
        if ray_address and executor != "ray":
            raise click.UsageError("--ray-address needs --executor ray")
        return fn(*args, executor=ExecutorSpec(executor, ray_address), **kwargs)

    wrapper = click.option("--ray-address", metavar="ADDR", default=None,
                           help="Ray cluster to run on, e.g. 10.0.0.1:6379 [default: $RAY_ADDRESS, else a one-machine "
                                "cluster started for this run]. Every node must see IN and OUT at the same path.")(wrapper)
    return click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                        help="Where the per-shard jobs run: local = a process pool here; ray = Ray tasks across a "
                             f"cluster ({install_command('ray')}; docs/SCALE.md). With ray, --workers caps the "
                             "tasks in flight.")(wrapper)
