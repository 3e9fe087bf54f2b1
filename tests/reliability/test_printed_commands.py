"""Issue 23 item 11 (issue 16 of the attack): the commands the tool prints for the user to paste (the
converter's `next:` line, SERVING.md's launch and marlin-to-source lines) are one shell word per path,
whatever the path holds (spaces, quotes, a newline), and `next:` works from any folder. Real CLI runs
in subprocesses; the printed line is split and run by a real bash.

Substitutions: `dsv4-convert` in the printed line is replaced by this venv's `python -m
dsv4_convert.cli` (the console script's shebang may point at another tree in a copied venv)."""

from __future__ import annotations

import shlex
import subprocess

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI


def _words(line: str) -> list[str]:
    """The words bash makes of `line` (the printed command, pasted)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def test_printed_paths_survive_spaces_quotes_and_newlines(tmp_path):
    base = tmp_path / "it's a dir"
    src = write_synthetic_checkpoint(base / "the src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    out = base / "my out\nnext line"
    proc = subprocess.run([*CLI, "nvfp4-to-marlin", "the src", out.name, "--workers", "1"], cwd=base,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("next: "))
    words = _words(line.removeprefix("next: "))
    assert words == ["dsv4-convert", "validate", str(out), "--against", str(src)], words
    # pasted in another folder, it still validates the right checkpoint
    cmd = " ".join(map(shlex.quote, CLI)) + " " + line.removeprefix("next: dsv4-convert ") + " -q --gemm-experts 0"
    ran = subprocess.run(["bash", "-c", cmd], cwd="/", capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    serving = (out / "SERVING.md").read_text()
    launch = next(ln for ln in serving.splitlines() if "--model-path" in ln)
    words = _words(launch)
    assert words[words.index("--model-path") + 1] == out.name
    reverse = next(ln for ln in serving.splitlines() if "marlin-to-source" in ln)
    words = _words(reverse.split("`")[1])
    assert words[:3] == ["dsv4-convert", "marlin-to-source", out.name], words
