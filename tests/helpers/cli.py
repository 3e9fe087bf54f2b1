"""Run the real CLI in a subprocess, and hash directories, for the converter tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

CLI = [sys.executable, "-m", "dsv4_convert.cli"]

# The node id of the running test when it is not marked slow (set by tests/conftest.py). Starting the CLI
# makes a test slow, so run_cli warns that it belongs marked: that keeps the fast loop fast as tests are added.
UNMARKED_TEST: str | None = None


class NotMarkedSlow(UserWarning):
    """A test started the CLI without the slow marker (CONTRIBUTING.md, "Slow tests")."""


HOOKS = Path(__file__).resolve().parents[1] / "hooks"  # the test-only hooks (sitecustomize.py there)
HOOK_VARS = ("DSV4_CONVERT_KILL_AT", "DSV4_CONVERT_RUN_AT", "DSV4_CONVERT_PIECE_BYTES", "DSV4_CONVERT_PAUSE_TASK")  # as tests/hooks/sitecustomize.py reads them


def with_hooks(pythonpath: str | None) -> str:
    """PYTHONPATH with tests/hooks first (its sitecustomize.py acts only on the variables it reads)."""
    return os.pathsep.join(filter(None, [str(HOOKS), pythonpath]))


def _warn_if_unmarked() -> None:
    if UNMARKED_TEST:
        warnings.warn(NotMarkedSlow(f"{UNMARKED_TEST} starts the CLI: mark it slow (CONTRIBUTING.md)"), stacklevel=3)


def run_cli(*args, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    _warn_if_unmarked()
    e = dict(os.environ, **(env or {}))
    if set(HOOK_VARS) & set(env or {}):  # tests/hooks, never shipped code
        e["PYTHONPATH"] = with_hooks(e.get("PYTHONPATH"))
    proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, env=e)
    if check and proc.returncode != 0:
        raise AssertionError(f"dsv4-convert {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


BATCH = Path(__file__).resolve().parent / "cli_batch.py"


def run_cli_batch(commands: list[list], work: Path, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Several command lines in ONE CLI process (cli_batch.py: `main(argv)` each, as the console script runs it),
    each answered as run_cli(check=False) answers: its exit code, stdout and stderr, where an exception that
    escaped `main` is exit 1 with its traceback on stderr, as a real process shows it. One torch import for
    all: a test of many small commands pays it once instead of once a command (CONTRIBUTING.md, CI time).
    `env` is laid over this process's environment, one for every command; a variable given None is removed."""
    _warn_if_unmarked()
    listing = Path(work) / f"commands-{os.getpid()}-{len(commands)}.json"
    listing.write_text(json.dumps([[str(a) for a in c] for c in commands]))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [subprocess.CompletedProcess(r["argv"], r["code"], r["stdout"], r["stderr"] + (r["crash"] or ""))
            for r in json.loads(proc.stdout)]


def run_cli_steps(steps: dict, work: Path, env: dict | None = None) -> dict:
    """{key: argv} -> {key: the CLI's answer}, all in one CLI process (run_cli_batch)."""
    return dict(zip(steps, run_cli_batch(list(steps.values()), work, env=env))) if steps else {}


def succeeded(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`proc`, which must have exited 0 (else: its command line, exit code and the ends of its output)."""
    assert proc.returncode == 0, (f"{' '.join(map(str, proc.args))} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc


def tree_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


MARKER = "dsv4-convert.marker.json"  # older marlin-to-source outputs' record: never in a rebuilt checkpoint now


def restored_tree(root: Path) -> dict[str, str]:
    """tree_hashes of a marlin-to-source output: the source's files alone (its "this tool wrote it" mark is an
    extended attribute of the directory, runtime/output/rules.py mark_restored, never a file)."""
    hashes = tree_hashes(root)
    assert MARKER not in hashes, "marlin-to-source writes no file of its own into the rebuilt checkpoint"
    return hashes


def rerecord(root: Path, rel: str) -> None:
    """Make OUT's manifest agree with an edited file, as a consistent attacker would."""
    import json

    from dsv4_convert.core.files import MANIFEST
    from dsv4_convert.runtime.digest import file_digest

    doc = json.loads((root / MANIFEST).read_text())
    doc["files"][rel] = dict(doc["files"][rel], size=(root / rel).stat().st_size,
                             hash=file_digest(root / rel, doc["hash_algorithm"]))
    (root / MANIFEST).write_text(json.dumps(doc))
