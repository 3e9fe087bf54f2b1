"""A user who can write neither the install nor $HOME (a service account, a container's non-root user)
converts and validates: numba's compiled code goes to a private folder of theirs under the temporary
directory, or, where even that is not theirs, is compiled in every process; never numba's
"cannot cache function '_swap': no locator available" at import (issue 28, item 14).

Run as a real other user: the test (as root) starts the CLI as `nobody` with HOME=/nonexistent,
so the install (root's) and $HOME are really unwritable. Substitutions: the interpreter is the
system's python3 of the same version with this environment's site-packages added, where the
environment's own interpreter is not reachable by that user (e.g. under root's home); skipped when not
root (no other user to become) or when no such interpreter exists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
_ENTRY = "import site, sys; site.addsitedir(%r); from dsv4_convert.cli.main import main; main()"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")]


def _as_nobody(cmd: list[str], env: dict, **kw) -> subprocess.CompletedProcess:
    def drop():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    return subprocess.run(cmd, env=env, preexec_fn=drop, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def python_for_nobody() -> list[str]:
    site = sysconfig.get_paths()["purelib"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in dict.fromkeys([sys.executable, os.path.realpath(sys.executable), shutil.which(version, path="/usr/local/bin:/usr/bin:/bin") or ""]):
        try:
            usable = bool(exe) and _as_nobody([exe, "-c", _ENTRY % site, "--version"], env).returncode == 0
        except PermissionError:  # the user cannot even start it
            usable = False
        if usable:
            return [exe, "-c", _ENTRY % site]
    pytest.skip(f"no {version} that user {NOBODY} can run with {site}")


@pytest.fixture
def world(request):
    """A folder every user can read (pytest's tmp_path is root's only), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="dsv4-nobody-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _user_folder(path: Path) -> Path:
    path.mkdir()
    os.chown(path, NOBODY, NOBODY)
    return path


@pytest.mark.parametrize("tmp_owner", ["nobody", "root"], ids=["own-cache-folder", "no-cache-at-all"])
def test_a_user_who_cannot_write_the_install_or_home_converts_and_validates(python_for_nobody, world, tmp_owner,
                                                                          synth_source):
    src = world / "src"
    shutil.copytree(synth_source("nvfp4-modelopt-dsv4"), src)
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    tmpdir = world / "tmp"
    if tmp_owner == "nobody":
        _user_folder(tmpdir)
    else:  # the private folder's name is taken by a folder the user does not own: no cache at all
        (tmpdir / f"dsv4-convert-numba-{NOBODY}").mkdir(parents=True, mode=0o777)
        tmpdir.chmod(0o1777)
    out_root = _user_folder(world / "out")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "TMPDIR": str(tmpdir)}
    for attempt in range(2):  # the second run finds what the first cached (or compiles again)
        out = out_root / f"m{attempt}"
        r = _as_nobody([*python_for_nobody, "nvfp4-to-marlin", str(src), str(out), "-q"], env, cwd=world)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "locator" not in r.stderr
    shards = sorted(p.name for p in (out_root / "m0").glob("*.safetensors"))
    assert shards and all((out_root / "m0" / s).read_bytes() == (out_root / "m1" / s).read_bytes() for s in shards)
    if tmp_owner == "nobody":  # validate imports the same kernels (and torch): once is enough
        r = _as_nobody([*python_for_nobody, "validate", str(out_root / "m1"), "--against", str(src), "-q"], env,
                       cwd=world)
        assert r.returncode == 0, r.stdout + r.stderr
    cache = tmpdir / f"dsv4-convert-numba-{NOBODY}"
    if tmp_owner == "nobody":
        st = cache.stat()
        assert st.st_uid == NOBODY and st.st_mode & 0o777 == 0o700
        assert any(cache.rglob("*.nbi")), "the compiled kernels were not cached"
    else:
        assert not any(cache.rglob("*.nbi")), "a cache was written into a folder the user does not own"
