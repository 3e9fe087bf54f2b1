"""The SGLang 0.5.23 JIT Marlin test equipment (tests/gpu/sglang_kernels): SOURCES.sha256 names the installed
sglang wheel's files with their real hashes, the wheels prepare.py fetches are sglang's and the lock's pins, the
kernel table's JIT sources are among the files carried, and prepare.py refuses a changed or missing source by
name and writes nothing.

Substitutions: the refusal test runs prepare.py on a made-up venv: the installed wheel's listed files copied,
one changed by a byte, one deleted, and a made-up sgl_kernel/scalar_type.py (.venv-sglang does not install
sglang-kernel; its 373 MB wheel is not fetched in tests). No network: the download steps are not run here (the
equipment's first assembly was compared with ../shared/sglang-kernels-0.5.23 by diff -r). The tests that read
the installed wheel skip without a finished .venv-sglang (its build stamp).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsv4_convert.core.targets.engines import release_for
from tests.gpu.sglang_kernels import prepare

REPO = Path(__file__).resolve().parents[1]
LISTING = prepare.sources()
SGLANG_FILES = {r: d for r, d in LISTING.items() if not r.startswith(prepare.KERNEL_PREFIX)}


def _site() -> Path:
    # .ci/run builds the engine venvs while this suite runs: only a finished build (its stamp) is read
    if not (REPO / ".venv-sglang/.dsv4-stamp").is_file():
        pytest.skip("no finished .venv-sglang (serving_tests/build_venvs.sh sglang) to check against")
    try:
        return prepare.site_packages(REPO / ".venv-sglang")
    except prepare.Refused as e:
        pytest.skip(f"no installed sglang 0.5.23 to check against: {e}")


def test_sources_sha256_matches_the_installed_sglang_wheel(capsys):
    site = _site()
    assert prepare.main(["--check", "--venv", str(REPO / ".venv-sglang")]) == 0
    assert f"{len(SGLANG_FILES)} sglang files" in capsys.readouterr().out
    # the sources the kernel table says SGLang's JIT compiles are carried (relative to the sglang package)
    jit = release_for("sglang", "0.5.23").kernels.sources
    assert jit and all(f"sglang/{s}" in LISTING for s in jit)
    # the pinned downloads are the ones sglang 0.5.23 requires (its METADATA, itself hash-checked above)
    requires = {line.split(":", 1)[1].strip() for line in
                (site / prepare.SGLANG_DIST / "METADATA").read_text().splitlines() if line.startswith("Requires-Dist:")}
    assert prepare.SGLANG_KERNEL in requires and "apache-tvm-ffi==0.1.11" in requires and "msgspec" in requires


def test_downloaded_wheels_are_the_lock_files_pins():
    lock = (REPO / "serving_tests/locks/sglang-0.5.23-cpu-test.lock").read_text().split()
    assert set(prepare.WHEELS) <= set(lock)
    assert set(prepare.WHEELS) == {"apache-tvm-ffi==0.1.11", "msgspec==0.22.0"}


def test_a_changed_or_missing_source_is_refused_by_name_and_nothing_is_written(tmp_path, capsys):
    site = _site()
    fake = tmp_path / "venv/lib/python3.12/site-packages"
    for rel in SGLANG_FILES:
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, fake / rel)
    changed, missing = "sglang/kernels/jit/csrc/gemm/marlin_moe/marlin_template.h", "sglang/kernels/jit/utils/deps.py"
    data = bytearray((fake / changed).read_bytes())
    data[100] ^= 1
    (fake / changed).write_bytes(bytes(data))
    (fake / missing).unlink()
    (fake / "sgl_kernel").mkdir()
    (fake / "sgl_kernel/scalar_type.py").write_text("# made up\n")
    dest = tmp_path / "out"
    assert prepare.main(["--venv", str(tmp_path / "venv"), "--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert f"3 of {len(LISTING)} source files do not match" in err
    assert f"{changed}: sha256 " in err and f"{missing}: missing" in err and "sgl_kernel/scalar_type.py: sha256" in err
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["venv"]
    # the untouched files are not named
    assert "marlin/marlin_template.h" not in err.replace(changed, "")


def test_no_sglang_install_is_refused_with_the_fix(tmp_path, capsys):
    assert prepare.main(["--check", "--venv", str(tmp_path)]) == 1
    assert "serving_tests/build_venvs.sh sglang" in capsys.readouterr().err
