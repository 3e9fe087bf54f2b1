"""The executor seam without a cluster: the local executor and the package never import Ray, a
missing Ray is a usage error that names the extra, --executor ray with a GPU device is refused, and
the fence moves an older run's scratch directory out of the staging directory.

Substitutions: "Ray not installed" is simulated by sys.modules['ray'] = None in the subprocess (what
Python does for a module that cannot be imported), because CI installs Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_convert.core.errors import UsageError
from dsv4_convert.runtime.executors import ExecutorSpec, refuse_device
from dsv4_convert.runtime.jobs import RunDir


def _in_subprocess(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_importing_and_converting_locally_never_imports_ray(tmp_path, synth_source):
    src = synth_source("nvfp4-modelopt-dsv4", experts=4)
    code = ("import sys\n"
            "import dsv4_convert, dsv4_convert.runtime.executors, dsv4_convert.convert.pipeline, dsv4_convert.convert.reverse\n"
            "import dsv4_convert.validate.runner\n"
            "from dsv4_convert.cli.main import main\n"
            "for argv in (['--help'], ['nvfp4-to-marlin', sys.argv[1], sys.argv[2], '-q', '--workers', '2'],\n"
            "             ['validate', sys.argv[2], '--quiet'], ['marlin-to-source', sys.argv[2], sys.argv[3], '-q']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as e:\n"
            "        assert e.code in (0, None), (argv, e.code)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))\n")
    out = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "out"), str(tmp_path / "back")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "back").is_dir()


def test_ray_missing_is_a_usage_error_naming_the_extra(tmp_path, synth_source):
    src = synth_source("nvfp4-modelopt-dsv4", experts=4)
    code = ("import sys; sys.modules['ray'] = None\n"
            "from dsv4_convert.cli.main import main\n"
            f"main(['nvfp4-to-marlin', {str(src)!r}, {str(tmp_path / 'out')!r}, '--executor', 'ray'])\n")
    proc = _in_subprocess(code)
    assert proc.returncode == 2, proc.stderr
    assert "usage.ray_missing" in proc.stderr and "pip install '/path/to/dsv4-convert[ray]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_ray_address_without_the_ray_executor_is_refused(tmp_path, synth_source):
    src = synth_source("nvfp4-modelopt-dsv4", experts=4)
    proc = _in_subprocess("from dsv4_convert.cli.main import main\n"
                          f"main(['nvfp4-to-marlin', {str(src)!r}, {str(tmp_path / 'o')!r}, '--ray-address', 'x:1'])\n")
    assert proc.returncode == 2 and "--ray-address needs --executor ray" in proc.stderr


def test_ray_with_a_gpu_device_is_refused():
    refuse_device(ExecutorSpec("ray"), "cpu")
    refuse_device(ExecutorSpec("local"), "cuda")
    with pytest.raises(UsageError, match="--device cuda"):
        refuse_device(ExecutorSpec("ray"), "cuda")


def test_the_fence_moves_an_older_runs_scratch_directory_out_of_staging(tmp_path):
    staging = tmp_path / "out.partial"
    staging.mkdir()
    old = RunDir(staging)
    old.create()
    held = open(old.tmp("a.safetensors"), "wb")  # a surviving task, mid-write
    RunDir.fence(staging)
    assert list(staging.iterdir()) == []
    held.write(b"late bytes")  # lands in an unlinked file, never in the staging directory
    held.close()
    with pytest.raises(FileNotFoundError):  # the old task's next file cannot be created
        open(old.tmp("b.safetensors"), "wb")
    assert list(staging.iterdir()) == []
    assert not list(tmp_path.glob("out.partial.fenced-*"))


def test_hand_over_refuses_a_file_of_the_wrong_size(tmp_path):
    run = RunDir(tmp_path)
    run.create()
    run.tmp("s").write_bytes(b"12345")
    with pytest.raises(Exception, match="reported 9 bytes"):
        run.hand_over("s", 9, tmp_path)
    run.hand_over("s", 5, tmp_path)
    assert (tmp_path / "s.tmp").read_bytes() == b"12345"
    assert Path(run.path).is_dir()
