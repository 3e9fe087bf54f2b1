"""Issue 10, items 1 and 4: the input survives every path alias, and --force replaces only what this
tool wrote. Real synth checkpoints, the real CLI command lines; each refusal must leave IN and any
foreign directory byte for byte as they were and leave nothing stray.

Substitutions: the command lines run in two CLI processes, in order (run_cli_batch: `main(argv)` each, as the
console script runs it, its exit code, stdout and stderr): the outputs some tests start from, then every test's
commands, each test in a directory of its own; what a refusal must leave untouched is hashed before the second
process and compared after it (no command of that test writes there). A bind mount needs root and mount(8); the (device, inode) comparison that would
catch one is exercised through a symlinked parent and a symlink to IN instead)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli_batch, tree_hashes

CONVERT = ("nvfp4-to-marlin",)
ARGS = ("--workers", "1", "-q")
PLANS: dict = {}  # test -> plan(d, ck) -> (command lines run first, what the user then does or None, its steps)


def _plan(test: str):
    def register(make):
        PLANS[test] = make
        return make
    return register


def _ok(*argv) -> tuple:
    return argv, 0, None, ()


def _refusal(argv, code: int, error_id: str, *protect: Path) -> tuple:
    return tuple(argv), code, error_id, protect


def _ck(d: Path) -> Path:
    src = d / "models" / "ck"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    (d / "models" / "sibling.txt").write_text("a sibling of IN")
    return src


def _state(p: Path):
    return tree_hashes(p) if p.is_dir() else p.read_bytes()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """test -> (its directory, [(step, the CLI's answer, {protected path: its state before})]): every plan's first
    lines in one CLI process, then what the user does, the protected paths hashed, every step in a second one."""
    work = tmp_path_factory.mktemp("paths")
    plans, first = {}, []
    for test, make in PLANS.items():
        d = work / test
        d.mkdir()
        plans[test] = (d, *make(d, _ck(d)))
        first += plans[test][1]
    for proc in run_cli_batch(first, work) if first else ():
        assert proc.returncode == 0, (proc.args, proc.stderr)
    for _, _, arrange, _ in plans.values():
        if arrange:
            arrange()
    steps = [(test, step, {p: _state(p) for p in step[3]}) for test, (_, _, _, ss) in plans.items() for step in ss]
    answers = run_cli_batch([list(step[0]) for _, step, _ in steps], work)
    out = {test: (d, []) for test, (d, *_) in plans.items()}
    for (test, step, before), proc in zip(steps, answers):
        out[test][1].append((step, proc, before))
    return out


def _check(runs, test: str) -> Path:
    """Each step of `test` answered as planned: its exit code, its error id on stderr, no traceback, and what it
    must not touch as it was. Returns the test's directory."""
    d, done = runs[test]
    for (argv, code, error_id, _), proc, before in done:
        assert proc.returncode == code, (argv, proc.stderr)
        assert error_id is None or f"error[{error_id}]" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        for p, h in before.items():
            assert _state(p) == h, f"{p} was modified"
    return d


@_plan("dotdot")
def _dotdot(d, ck):
    (ck / "sub").mkdir()
    return [], None, [_refusal([*CONVERT, ck, ck / "sub" / "..", *ARGS, "--force"], 2, "usage.same_path", ck)]


def test_out_equal_to_in_through_dotdot_is_refused(runs):
    _check(runs, "dotdot")


@_plan("symlink-to-in")
def _symlink_to_in(d, ck):
    (d / "link").symlink_to(ck)
    return [], None, [_refusal([*CONVERT, d / "link", ck, *ARGS, "--force"], 2, "usage.same_path", ck)]


def test_out_equal_to_in_through_a_symlink_is_refused(runs):
    _check(runs, "symlink-to-in")


@_plan("in-inside-out")
def _in_inside_out(d, ck):
    return [], None, [_refusal([*CONVERT, ck, ck.parent, *ARGS, "--force"], 2, "paths.input_inside_output", ck.parent)]


def test_in_inside_out_is_refused_and_siblings_survive(runs):
    _check(runs, "in-inside-out")


@_plan("out-inside-in")
def _out_inside_in(d, ck):
    return [], None, [_refusal([*CONVERT, ck, ck / "converted", *ARGS], 2, "paths.output_inside_input", ck)]


def test_out_inside_in_is_refused(runs):
    ck = _check(runs, "out-inside-in") / "models" / "ck"
    assert not (ck / "converted").exists() and not (ck / "converted.partial").exists()


@_plan("in-inside-partial")
def _in_inside_partial(d, ck):
    src = d / "x.partial" / "ck"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    return [], None, [_refusal([*CONVERT, src, d / "x", *ARGS, "--resume"], 2, "paths.input_inside_staging", src.parent)]


def test_in_inside_out_partial_is_refused(runs):
    _check(runs, "in-inside-partial")


@_plan("reverse-onto-input")
def _reverse_onto_input(d, ck):
    out = d / "c"
    return [[*CONVERT, ck, out, *ARGS]], None, [
        _refusal(["marlin-to-source", out, out, "--force", "-q"], 2, "usage.same_path", out),
        _refusal(["marlin-to-source", out, out / "back", "-q"], 2, "paths.output_inside_input", out)]


def test_marlin_to_source_onto_its_input_is_refused(runs):
    _check(runs, "reverse-onto-input")


@_plan("foreign")
def _foreign(d, ck):
    mine = d / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    return [], None, [_refusal([*CONVERT, ck, mine, *ARGS, "--force"], 5, "paths.not_our_output", mine),
                      _refusal(["synth", mine, "--force"], 5, "paths.not_our_output", mine)]


def test_force_onto_a_foreign_directory_is_refused(runs):
    _check(runs, "foreign")


@_plan("force-ours")
def _force_ours(d, ck):
    out, back, syn = d / "out", d / "back", d / "syn"
    return [], None, [_ok(*CONVERT, ck, out, *ARGS),
                      _ok(*CONVERT, ck, out, *ARGS, "--force"),  # recognised by its manifest
                      _ok("marlin-to-source", out, back, "-q"),
                      _ok("marlin-to-source", out, back, "-q", "--force"),  # recognised by its marker
                      _ok("synth", syn),
                      _ok("synth", syn, "--force")]  # README's set-up command, run twice


def test_force_replaces_our_own_outputs(runs):
    d = _check(runs, "force-ours")
    assert not [p for p in d.iterdir() if ".partial" in p.name or ".replaced" in p.name]


@_plan("unlisted")
def _unlisted(d, ck):
    out = d / "out"
    return [[*CONVERT, ck, out, *ARGS]], lambda: (out / "notes.txt").write_text("added by the user"), [
        _refusal([*CONVERT, ck, out, *ARGS, "--force"], 5, "paths.unlisted_files", out)]


def test_force_refuses_files_the_record_does_not_list(runs):
    _check(runs, "unlisted")


def _onto(kind: str):
    def plan(d, ck):
        out, target = d / "out", d / "target"
        target.mkdir()
        (target / "keep").write_text("x")
        if kind == "file":
            out.write_text("a file")
        else:
            out.symlink_to(target)
        error = "paths.out_not_directory" if kind == "file" else "paths.out_symlink"
        return [], None, [_refusal([*CONVERT, ck, out, *ARGS, "--force"], 5, error, target, ck)]
    return plan


for _kind in ("file", "symlink"):
    _plan(f"onto-{_kind}")(_onto(_kind))


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_force_onto_a_file_or_symlink_refuses_before_any_work(runs, kind):
    d = _check(runs, f"onto-{kind}")
    out = d / "out"
    assert not [p for p in d.iterdir() if ".partial" in p.name or ".replaced" in p.name]
    assert out.is_symlink() if kind == "symlink" else out.read_text() == "a file"


@_plan("foreign-partial")
def _foreign_partial(d, ck):
    out, partial = d / "out", d / "out.partial"
    partial.mkdir()
    (partial / "precious").write_text("not ours")
    (d / "o2.partial").symlink_to(partial)
    return [], None, [
        *(_refusal([*CONVERT, ck, out, *ARGS, *extra], 5, "paths.partial_not_ours", partial)
          for extra in ((), ("--resume",), ("--force",))),
        _refusal([*CONVERT, ck, d / "o2", *ARGS, "--force"], 5, "paths.partial_not_ours", partial)]


def test_a_foreign_out_partial_is_never_adopted_or_deleted(runs):
    _check(runs, "foreign-partial")


@_plan("names")
def _names(d, ck):
    bad = os.fsdecode(bytes(d) + b"/out-\xff")
    return [], None, [_refusal([*CONVERT, ck, bad, *ARGS], 2, "paths.not_utf8", ck),
                      _refusal([*CONVERT, ck, d / ("x" * 250), *ARGS], 2, "paths.name_too_long", ck),
                      _refusal(["synth", d / ("y" * 255)], 2, "paths.name_too_long")]


def test_non_utf8_and_overlong_out_names_are_refused_before_work(runs):
    d = _check(runs, "names")
    assert sorted(p.name for p in d.iterdir()) == ["models"]
