"""doctor and the fatbinary reader on CPU: the committed fixture libraries (built on the H200 with
nvcc 13.0 by tests/fixtures/fatbin/make.sh; cuobjdump's listing of each is committed beside them and
is the independent reference), and doctor's report on a machine without GPU or engines.

Substitutions: the GPUs of the PTX-only verdict test are given as rows (CI has none); the library
read is the real fixture.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4_convert.cli.doctor import Doctor
from dsv4_convert.cli.doctor_kernels import check_library
from dsv4_convert.cli.fatbin import FatbinError, elf_section, parse_fatbin, read_cuda_code

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fatbin"
CLI = [sys.executable, "-m", "dsv4_convert.cli"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the report of a machine without a GPU")


def _cuobjdump_record() -> dict[str, tuple[set, set]]:
    """What cuobjdump listed for each fixture (sm_XX of its ELF and PTX files)."""
    out, current = {}, None
    for line in (FIX / "cuobjdump.txt").read_text().splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            out[current] = (set(), set())
        elif current and (m := re.search(r"(ELF|PTX) file\s+\d+: .*\.sm_(\d+)\.(cubin|ptx)", line)):
            out[current][0 if m.group(1) == "ELF" else 1].add(int(m.group(2)))
    return out


@pytest.mark.parametrize("name", ["sm90_sass.so", "sm90_ptx.so", "sm90_both.so"])
def test_reader_agrees_with_cuobjdump(name):
    sass, ptx = _cuobjdump_record()[name]
    code = read_cuda_code(FIX / name)
    assert (code.sass, code.ptx) == (sass, ptx)


def test_fixture_kinds_are_what_make_sh_built():
    assert read_cuda_code(FIX / "sm90_sass.so").sass == {90} and not read_cuda_code(FIX / "sm90_sass.so").ptx
    assert read_cuda_code(FIX / "sm90_ptx.so").ptx == {90} and not read_cuda_code(FIX / "sm90_ptx.so").sass


def test_compatibility_rules():
    sass, ptx = read_cuda_code(FIX / "sm90_sass.so"), read_cuda_code(FIX / "sm90_ptx.so")
    assert sass.runs_natively(9, 0) and not sass.runs_natively(12, 0) and not sass.runs_natively(8, 9)
    assert ptx.ptx_for(12, 0) and not ptx.ptx_for(8, 0) and not ptx.runs_natively(9, 0)


def test_non_elf_and_library_without_cuda(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_bytes(b"not an elf at all" * 8)
    with pytest.raises(FatbinError):
        read_cuda_code(bad)
    py = Path(sys.executable).resolve()
    if py.read_bytes()[:4] == b"\x7fELF":
        assert elf_section(py, ".nv_fatbin") is None
        assert read_cuda_code(py).sass == set()


def test_truncated_fatbin_is_an_error():
    data = elf_section(FIX / "sm90_both.so", ".nv_fatbin")
    assert struct.unpack_from("<I", data)[0] == 0xBA55ED50
    with pytest.raises(FatbinError):
        parse_fatbin(data[: len(data) // 2])
    with pytest.raises(FatbinError):
        parse_fatbin(b"\x01\x02\x03\x04" + data[4:])


def test_ptx_only_library_on_sm120_gives_the_40923_finding():
    d = Doctor(gpus=[{"index": 0, "name": "RTX PRO 6000", "sm": 120}, {"index": 1, "name": "H200", "sm": 90}])
    check_library(d, "vllm", FIX / "sm90_ptx.so")
    check_library(d, "vllm", FIX / "sm90_both.so")
    assert d.extensions[0]["verdict"] == ["sm_120: PTX only", "sm_90: PTX only"]
    assert d.extensions[1]["verdict"] == ["sm_120: PTX only", "sm_90: SASS"]
    assert len(d.findings) == 3 and all("#40923" in f for f in d.findings)


@NO_GPU
def test_doctor_without_gpu_or_engines_reports_everything_else(tmp_path):
    proc = subprocess.run([*CLI, "doctor", "--json", "--kernel-module", FIX / "sm90_both.so"], capture_output=True,
                          text=True)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["gpus"] == [] and data["torch"]["version"] == torch.__version__
    assert any("no CUDA GPU" in f for f in data["findings"])
    ext = next(x for x in data["extensions"] if x["engine"] == "module")
    assert ext["sass"] == [90] and ext["ptx"] == [90]
    text = subprocess.run([*CLI, "doctor"], capture_output=True, text=True)
    assert text.returncode == 1 and "GPU         none" in text.stdout and "Traceback" not in text.stderr


def test_doctor_with_a_converted_checkpoint_names_engine_and_flag(tmp_path):
    subprocess.run([*CLI, "synth", tmp_path / "src", "--layers", "1", "--experts", "2"], check=True,
                   capture_output=True)
    subprocess.run([*CLI, "nvfp4-to-marlin", tmp_path / "src", tmp_path / "out", "--target", "vllm", "-q"],
                   check=True, capture_output=True)
    data = json.loads(subprocess.run([*CLI, "doctor", tmp_path / "out", "--json"], capture_output=True,
                                     text=True).stdout)
    assert data["checkpoint"]["layout"] == "vllm-L4"
    assert data["recommended"] == ["vllm: --moe-backend marlin"]
    if data["engines"]["vllm"] is None:
        assert any("needs vllm" in f for f in data["findings"]) and data["exit_code"] == 1


def test_doctor_says_when_the_engines_cannot_build_the_source():
    """llm-compressor 0.14's DeepSeek-V3 export (tests/fixtures/producers): its config.json lacks keys both engines
    read (core/targets/engine_config.py), so it is not 'ready' whatever the machine holds."""
    src = Path(__file__).resolve().parents[1] / "fixtures" / "producers" / "llmc-deepseek-v3-nvfp4a16"
    data = json.loads(subprocess.run([*CLI, "doctor", src, "--json"], capture_output=True, text=True).stdout)
    said = [f for f in data["findings"] if "cannot build or load this model" in f]
    assert {f.split(": ", 1)[1].split(" ", 1)[0] for f in said} == {"sglang", "vllm"}, data["findings"]
    assert data["exit_code"] == 1 and all("moe_layer_freq" in f for f in said), said


def test_doctor_cannot_run_on_a_bad_path(tmp_path):
    assert subprocess.run([*CLI, "doctor", tmp_path / "missing"], capture_output=True).returncode == 2
    proc = subprocess.run([*CLI, "doctor", tmp_path], capture_output=True, text=True)  # no config.json
    assert proc.returncode == 2 and "error[" in proc.stderr
