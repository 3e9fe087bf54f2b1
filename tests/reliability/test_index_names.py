"""Issue 37 items 2-4, through the real CLI: the names a checkpoint's index and headers give.

- A tensor name that escapes a lone UTF-16 surrogate (`"weird\\ud800name"`, in a shard header and the
  index): every command refuses it, typed (`header.not_utf8`; the safetensors library refuses that
  header too), where the converter used to crash in the plan's fingerprint and validate, inspect and
  plan said OK. The same name in the index alone: `index.not_json`. No traceback, `--json` one object.
- An index that names `../outside.safetensors`: every command refuses it with `index.unsafe_path`
  before it opens that file (validate used to open and parse it first). "Opened" is observed with
  Linux inotify on the outside file (IN_OPEN), not inferred from the output.

Substitutions: real synthetic checkpoints, damaged by byte-level edits, and the real CLI; inotify is read through
ctypes, Linux only. The `--json` command lines run in one CLI process (run_cli_batch: `main(argv)` each, as the
console script runs it, its exit code, stdout and stderr), not one process each: a process start costs more than
these commands; their JSON is ASCII (json.dumps), so a process's stdout encoding cannot change it. The human-text
runs keep a process each: whether a real stdout / stderr can print the name is what they test. Each outside file
has its own watch, opened before the batch and read after it (no other command names that file)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil

import pytest

from tests.helpers.cli import run_cli, run_cli_batch
from tests.helpers.corrupt import INDEX, add_tensor, copy_checkpoint, edit_json

pytestmark = pytest.mark.slow

FMT = "nvfp4-modelopt-dsv4"
SMALL = {"layers": 1, "experts": 4, "shards": 2}
WEIRD = "weird\ud800name"
_IN_OPEN = 0x20


def _commands(root, tmp) -> dict[str, tuple[list, int]]:
    """command -> (argv, the exit code of an input refusal for it)."""
    return {
        "nvfp4-to-marlin": (["nvfp4-to-marlin", root, tmp / "out", "-q", "--workers", "1"], 3),
        "inspect": (["inspect", root], 3),
        "validate": (["validate", root, "-q", "--workers", "1"], 2),
        "plan": (["plan", root, "--gpus", "1", "--gpu-mem-gib", "96"], 2),
        "doctor": (["doctor", root], 2),
    }


def _json_error(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)["error"]


@pytest.fixture(scope="module")
def weird_names(synth_source, tmp_path_factory):
    """case -> a checkpoint where WEIRD names a tensor in: a shard header and the index ("both", the
    issue's case), the header alone ("header"), the index alone ("index")."""
    base, work = synth_source(FMT, **SMALL), tmp_path_factory.mktemp("weird")
    shard = sorted(set(json.loads((base / INDEX).read_text())["weight_map"].values()))[0]
    roots = {}
    for case in ("both", "header", "index"):
        root = roots[case] = copy_checkpoint(base, work / case)
        if case != "index":
            add_tensor(root / shard, WEIRD, "U8", [4], b"\0" * 4)  # json.dumps writes it as \ud800 (ASCII)
        if case != "header":
            edit_json(root / INDEX, lambda idx: idx["weight_map"].__setitem__(WEIRD, shard))
    return roots


# what the reader refuses first: the index is read before the headers
EXPECTED = {"both": "index.not_json", "header": "header.not_utf8", "index": "index.not_json"}


COMMANDS = ["nvfp4-to-marlin", "inspect", "validate", "plan"]


@pytest.fixture(scope="module")
def weird_json(weird_names, tmp_path_factory) -> dict:
    """(command, case) -> its --json answer, all in one CLI process."""
    work = tmp_path_factory.mktemp("weird-json")
    steps = {(command, case): [*_commands(weird_names[case], work / f"{command}-{case}")[command][0], "--json"]
             for command in COMMANDS for case in sorted(EXPECTED)}
    return dict(zip(steps, run_cli_batch(list(steps.values()), work)))


@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_lone_surrogate_in_a_name_is_refused_typed(weird_names, weird_json, tmp_path, command, case):
    argv, code = _commands(weird_names[case], tmp_path)[command]
    proc = weird_json[command, case]
    if command == "validate":  # findings (exit 1) naming the surrogate, never "0 errors ... OK"
        assert "Traceback" not in proc.stderr, proc.stderr
        doc = json.loads(proc.stdout)
        assert proc.returncode == 1 and doc["summary"]["errors"] >= 1, proc.stdout[-2000:]
        assert ("header.not_utf8" if case != "index" else "lone UTF-16 surrogate") in proc.stdout
    else:
        err = _json_error(proc)
        assert proc.returncode == code and err["id"] == EXPECTED[case], (proc.returncode, err)
    proc = run_cli(*argv, check=False)  # human text on stderr: the name must be printable
    assert "Traceback" not in proc.stderr and proc.returncode in (1, code), proc.stderr


def test_the_header_is_one_the_library_refuses(weird_names):
    """The premise: the safetensors library refuses the damaged shard (so accepting it was the bug)."""
    import safetensors
    both = weird_names["both"]
    index = json.loads((both / INDEX).read_text())
    with pytest.raises(safetensors.SafetensorError):
        safetensors.deserialize((both / index["weight_map"][WEIRD]).read_bytes())


class _OpenWatch:
    """inotify IN_OPEN on one file: did any process open it since the watch began?"""

    def __init__(self, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        assert self.libc.inotify_add_watch(self.fd, os.fsencode(path), _IN_OPEN) >= 0

    def opened(self) -> bool:
        try:
            return len(os.read(self.fd, 4096)) > 0  # an event: the only one watched is IN_OPEN
        except BlockingIOError:
            return False

    def close(self):
        os.close(self.fd)


def _point_outside(root):
    """The index maps one tensor to ../outside.safetensors, a real shard's copy beside the root."""
    index = json.loads((root / INDEX).read_text())
    name, shard = next(iter(sorted(index["weight_map"].items())))
    outside = root.parent / "outside.safetensors"
    shutil.copyfile(root / shard, outside)
    edit_json(root / INDEX, lambda idx: idx["weight_map"].__setitem__(name, "../outside.safetensors"))
    return outside


OUTSIDE = ["nvfp4-to-marlin", "inspect", "validate", "plan", "doctor", "marlin-to-source"]


@pytest.fixture(scope="module")
def outside_runs(synth_source, tmp_path_factory) -> dict:
    """command -> (its --json answer on a checkpoint whose index names ../outside.safetensors, whether that file was
    opened, the exit code of an input refusal for it): a Marlin output made in one CLI process, then every command in a second, each on its own copy."""
    work = tmp_path_factory.mktemp("conv")
    (made,) = run_cli_batch([["nvfp4-to-marlin", synth_source(FMT, **SMALL), work / "marlin", "-q", "--workers", "1"]],
                            work)
    assert made.returncode == 0, made.stderr
    steps, watches, codes = {}, {}, {}
    for command in OUTSIDE:
        d = work / command
        if command == "marlin-to-source":
            root = d / "marlin"
            shutil.copytree(work / "marlin", root)
            steps[command], codes[command] = ["marlin-to-source", root, d / "back", "-q", "--workers", "1", "--json"], 3
        else:
            root = copy_checkpoint(synth_source(FMT, **SMALL), d / "src")
            argv, codes[command] = _commands(root, d)[command]
            steps[command] = [*argv, "--json"]
        watches[command] = _OpenWatch(_point_outside(root))
    try:
        answers = dict(zip(steps, run_cli_batch(list(steps.values()), work)))
        return {command: (answers[command], watches[command].opened(), codes[command]) for command in OUTSIDE}
    finally:
        for watch in watches.values():
            watch.close()


@pytest.mark.parametrize("command", OUTSIDE)
def test_an_index_naming_a_file_outside_is_refused_before_it_is_opened(outside_runs, command):
    proc, opened, code = outside_runs[command]
    assert not opened, f"{command} opened the file outside its checkpoint"
    err = _json_error(proc)
    assert proc.returncode == code and err["id"] == "index.unsafe_path", (proc.returncode, err, proc.stderr)


def test_the_watch_sees_an_open(tmp_path):
    """The observation can fail: opening the watched file is seen."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    watch = _OpenWatch(f)
    try:
        assert not watch.opened()
        f.read_bytes()
        assert watch.opened()
    finally:
        watch.close()
