"""The GPU suite's shared pieces: the skip rule, the real CLI in a subprocess (a command a process, or many command
lines in one CLI process: run_cli_batch), `validate --kernel` through the kernels under test, the results file,
and editing a converted checkpoint.

The kernels under test (tests/gpu/run.sh sets them per build): DSV4_KERNEL_ENGINE=sglang runs an installed
engine's own kernels (`--kernel-provider sglang`: SGLang 0.5.23's JIT ops, from the test build of its wheel's
sources), and then only that engine's target layout (its kernel reads its own global dtype); otherwise
DSV4_MARLIN_MODULE, a built vLLM extension (`--kernel-provider module:PATH`), on both targets' layouts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.cli import run_cli

MODULE = os.environ.get("DSV4_MARLIN_MODULE", "")
ENGINE = os.environ.get("DSV4_KERNEL_ENGINE", "")
PROVIDER = ENGINE or f"module:{MODULE}"
KERNELS = ENGINE or os.path.basename(MODULE)  # what the results file names
TARGETS = (ENGINE,) if ENGINE else ("vllm", "sglang")  # the target layouts the kernels under test run
needs_kernels = pytest.mark.skipif(not (torch.cuda.is_available() and (ENGINE or os.path.isfile(MODULE))),
                                   reason="needs a CUDA GPU and DSV4_MARLIN_MODULE = a built Marlin extension or "
                                          "DSV4_KERNEL_ENGINE = an installed engine (tests/gpu/run.sh sets them)")
RESULTS = os.environ.get("DSV4_GPU_RESULTS")


def record(**row):
    """One line of measured results for the closing note ($OUT/gpu_results.jsonl)."""
    if RESULTS:
        with open(RESULTS, "a") as f:
            f.write(json.dumps(row) + "\n")


def kernel_args(path, provider, *extra) -> list:
    """The command line of `validate PATH --kernel --json` through `provider` (PROVIDER)."""
    return ["validate", path, "--kernel", "--kernel-provider", provider, "--json", "--quiet", *extra]


def kernel_report(proc, check_rc=None) -> dict:
    """A `validate --kernel --json` answer's report (exit 0 or 1 only: never a crash, a traceback or a usage
    error); `check_rc`: the exit it must have."""
    assert proc.returncode in (0, 1) and proc.stdout.startswith("{"), (proc.returncode, proc.stderr[-3000:])
    data = json.loads(proc.stdout)
    if check_rc is not None:
        assert proc.returncode == check_rc, [f["message"] for f in data["findings"] if f["severity"] == "error"]
    return data


def kernel(path, provider, *extra, check_rc=None):
    """`validate PATH --kernel --json` through `provider` in its own CLI process: the report (kernel_report)."""
    return kernel_report(run_cli(*kernel_args(path, provider, *extra), check=False), check_rc)


def status(data, check_id):
    return next(c["status"] for c in data["checks"] if c["id"] == check_id)


def edit(out: Path, name: str, fn) -> None:
    """Replace tensor `name` of a checkpoint by fn(old tensor), in place."""
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    f = out / index[name]
    tensors = load_file(f)
    tensors[name] = fn(tensors[name]).contiguous()
    os.chmod(f, 0o644)
    save_file(tensors, f, metadata={"format": "pt"})
