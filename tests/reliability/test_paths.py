"""Issue 10, items 1 and 4: the input survives every path alias, and --force replaces only what this
tool wrote. Real synth checkpoints, the real CLI in subprocesses; each refusal must leave IN and any
foreign directory byte for byte as they were and leave nothing stray.

Substitutions: none (a bind mount needs root and mount(8); the (device, inode) comparison that would
catch one is exercised through a symlinked parent and a symlink to IN instead)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli, tree_hashes

CONVERT = ("nvfp4-to-marlin",)
ARGS = ("--workers", "1", "-q")


@pytest.fixture
def ck(tmp_path) -> Path:
    src = tmp_path / "models" / "ck"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    (tmp_path / "models" / "sibling.txt").write_text("a sibling of IN")
    return src


def _refused(args, code: int, error_id: str, *protect: Path):
    before = {p: tree_hashes(p) if p.is_dir() else p.read_bytes() for p in protect}
    proc = run_cli(*args, check=False)
    assert proc.returncode == code and f"error[{error_id}]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    for p, h in before.items():
        assert (tree_hashes(p) if p.is_dir() else p.read_bytes()) == h, f"{p} was modified"
    return proc


def test_out_equal_to_in_through_dotdot_is_refused(ck):
    (ck / "sub").mkdir()
    _refused([*CONVERT, ck, ck / "sub" / ".." , *ARGS, "--force"], 2, "usage.same_path", ck)


def test_out_equal_to_in_through_a_symlink_is_refused(ck, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(ck)
    _refused([*CONVERT, link, ck, *ARGS, "--force"], 2, "usage.same_path", ck)


def test_in_inside_out_is_refused_and_siblings_survive(ck):
    models = ck.parent
    _refused([*CONVERT, ck, models, *ARGS, "--force"], 2, "paths.input_inside_output", models)


def test_out_inside_in_is_refused(ck):
    _refused([*CONVERT, ck, ck / "converted", *ARGS], 2, "paths.output_inside_input", ck)
    assert not (ck / "converted").exists() and not (ck / "converted.partial").exists()


def test_in_inside_out_partial_is_refused(tmp_path):
    src = tmp_path / "x.partial" / "ck"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    _refused([*CONVERT, src, tmp_path / "x", *ARGS, "--resume"], 2, "paths.input_inside_staging", src.parent)


def test_marlin_to_source_onto_its_input_is_refused(ck, tmp_path):
    out = tmp_path / "c"
    run_cli(*CONVERT, ck, out, *ARGS)
    _refused(["marlin-to-source", out, out, "--force", "-q"], 2, "usage.same_path", out)
    _refused(["marlin-to-source", out, out / "back", "-q"], 2, "paths.output_inside_input", out)


def test_force_onto_a_foreign_directory_is_refused(ck, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    _refused([*CONVERT, ck, mine, *ARGS, "--force"], 5, "paths.not_our_output", mine)
    _refused(["synth", mine, "--force"], 5, "paths.not_our_output", mine)


def test_force_replaces_our_own_outputs(ck, tmp_path):
    out, back, syn = tmp_path / "out", tmp_path / "back", tmp_path / "syn"
    run_cli(*CONVERT, ck, out, *ARGS)
    run_cli(*CONVERT, ck, out, *ARGS, "--force")  # recognised by its manifest
    run_cli("marlin-to-source", out, back, "-q")
    run_cli("marlin-to-source", out, back, "-q", "--force")  # recognised by its marker
    run_cli("synth", syn)
    run_cli("synth", syn, "--force")  # README's set-up command, run twice
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or ".replaced" in p.name]


def test_force_refuses_files_the_record_does_not_list(ck, tmp_path):
    out = tmp_path / "out"
    run_cli(*CONVERT, ck, out, *ARGS)
    (out / "notes.txt").write_text("added by the user")
    _refused([*CONVERT, ck, out, *ARGS, "--force"], 5, "paths.unlisted_files", out)


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_force_onto_a_file_or_symlink_refuses_before_any_work(ck, tmp_path, kind):
    out = tmp_path / "out"
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    if kind == "file":
        out.write_text("a file")
    else:
        out.symlink_to(target)
    error = "paths.out_not_directory" if kind == "file" else "paths.out_symlink"
    _refused([*CONVERT, ck, out, *ARGS, "--force"], 5, error, target, ck)
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or ".replaced" in p.name]
    assert out.is_symlink() if kind == "symlink" else out.read_text() == "a file"


def test_a_foreign_out_partial_is_never_adopted_or_deleted(ck, tmp_path):
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    partial.mkdir()
    (partial / "precious").write_text("not ours")
    for extra in ((), ("--resume",), ("--force",)):
        _refused([*CONVERT, ck, out, *ARGS, *extra], 5, "paths.partial_not_ours", partial)
    partial_link = tmp_path / "o2.partial"
    partial_link.symlink_to(partial)
    _refused([*CONVERT, ck, tmp_path / "o2", *ARGS, "--force"], 5, "paths.partial_not_ours", partial)


def test_non_utf8_and_overlong_out_names_are_refused_before_work(ck, tmp_path):
    bad = os.fsdecode(bytes(tmp_path) + b"/out-\xff")
    _refused([*CONVERT, ck, bad, *ARGS], 2, "paths.not_utf8", ck)
    _refused([*CONVERT, ck, tmp_path / ("x" * 250), *ARGS], 2, "paths.name_too_long", ck)
    _refused(["synth", tmp_path / ("y" * 255)], 2, "paths.name_too_long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
