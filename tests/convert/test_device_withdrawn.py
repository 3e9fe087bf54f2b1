"""The converters run on the CPU only: `--device cuda` was measured slower than the CPU route and
withdrawn (docs/PERFORMANCE.md). It is refused with its own error id and the reason, before anything is
written (no GPU needed to say so); `--device cpu` from older scripts still converts. No substitutions:
the real CLI on a real synthetic checkpoint."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_device_cuda_is_refused_with_the_reason_and_nothing_written(synth_source, tmp_path, device):
    out = tmp_path / "out"
    r = run_cli("nvfp4-to-marlin", synth_source("nvfp4-modelopt-dsv4"), out, "--device", device, "--json", check=False)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"]["id"] == "usage.device_withdrawn"
    assert "CPU only" in doc["error"]["message"] and "PERFORMANCE.md" in doc["error"]["fix"]
    assert not out.exists() and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_device_cpu_still_converts_and_help_says_why(synth_source, tmp_path):
    run_cli("mxfp4-to-marlin", synth_source("mxfp4-dsv4"), tmp_path / "out", "--device", "cpu", "-q")
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    text = " ".join(run_cli("nvfp4-to-marlin", "--help").stdout.split())
    assert "runs on the CPU, by design" in text and "--device cuda" in text and "--device cpu|" not in text
