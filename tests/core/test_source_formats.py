"""The source-format table (core/sources/source_formats.py) is the only switch: a toy row added to it alone is
synthesised, detected, converted, validated and reversed byte for byte, and its conversion equals the
conversion of the same matrices written in an existing format.

Substitutions: the made-up format "nvfp4-toy" (a compressed-tensors-style scheme `nvfp4-toy-quantized` whose
expert tensors are named qweight / qscale / qglobal / qinput, with ModelOpt's multiplier global, unlike
compressed-tensors' reciprocal one) is added to the real table for the length of the test (monkeypatch.setitem
on FORMATS), which is the scenario under test. The real CLI runs in this process (cli.main.main, the real
command functions) so that it sees the row, with one worker: validate's forkserver workers would import the
table afresh, without the toy row. Nothing else is replaced: synth, the reader, the converter, validate and
marlin-to-source are the shipped code.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from dsv4_convert.cli.main import main
from dsv4_convert.core.checkpoint.reader import TensorReader, open_checkpoint
from dsv4_convert.core.sources import source_formats as table
from dsv4_convert.core.sources.detectors import ct
from dsv4_convert.core.sources.source_formats import FORMATS, MULTIPLIER, Suffixes, source_format, synth_formats
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import restored_tree, tree_hashes

TOY = dataclasses.replace(
    FORMATS["nvfp4-ct"], value="nvfp4-toy", summary="a toy NVFP4 scheme with its own tensor names",
    detect=ct, ct_format="nvfp4-toy-quantized", suffixes=Suffixes("qweight", "qscale", "qglobal", "qinput"),
    global_rule=MULTIPLIER)
ROOT = Path(__file__).resolve().parents[2]
KW = {"layers": 1, "experts": 4, "hidden": 128, "intermediate": 128, "shards": 2}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FORMATS, TOY.value, TOY)


def _cli(capsys, *args, exits=(0,)) -> dict:
    try:
        main([*map(str, args), "--json"])
        code = 0
    except SystemExit as e:  # a failure exits; success returns
        code = e.code
    out = capsys.readouterr().out
    assert code in exits, out[-3000:]
    return json.loads(out[out.index("{"):out.rindex("}") + 1])


def test_a_toy_format_in_the_table_alone_reaches_every_consumer(toy, tmp_path, capsys):
    assert "nvfp4-toy" in synth_formats() and source_format("nvfp4-toy") is TOY
    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-toy", **KW)
    config = json.loads((src / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-toy-quantized"

    ckpt = open_checkpoint(src)  # detection and grouping
    assert ckpt.format is TOY and "nvfp4-toy-quantized" in ckpt.format_reason
    assert len(ckpt.projections) == 3 * KW["experts"]
    assert {p.weight.name.rsplit(".", 1)[1] for p in ckpt.projections} == {"qweight"}
    assert {p.global_scale.name.rsplit(".", 1)[1] for p in ckpt.projections} == {"qglobal"}
    assert {p.input_scale.name.rsplit(".", 1)[1] for p in ckpt.projections} == {"qinput"}

    out = tmp_path / "out"
    done = _cli(capsys, "nvfp4-to-marlin", src, out, "--target", "vllm", "--allow-unservable", "--workers", 1)
    assert done["projections"] == 3 * KW["experts"]
    record = json.loads((out / "config.json").read_text())["quantization_config"]
    assert record["source_format"] == "nvfp4-toy"

    report = _cli(capsys, "validate", out, "--against", src, "--workers", 1, exits=(0, 1))
    errors = {f["check"] for f in report["findings"] if f["severity"] == "error"}
    assert errors <= {"marlin.serving_methods"}, report["findings"]
    ran = {c["id"] for c in report["checks"] if c["status"] == "pass"}
    assert {"marlin.layout.global", "nvfp4.global.invalid", "structure.quant_config.method"} <= ran
    assert report["summary"]["projections_checked"] == 3 * KW["experts"]

    source_report = _cli(capsys, "validate", src, "--workers", 1, exits=(0, 1))  # the source checks on its own tensors
    assert source_report["format"] == "nvfp4-toy" and source_report["summary"]["errors"] == 0

    back = tmp_path / "back"
    _cli(capsys, "marlin-to-source", out, back, "--workers", 1)
    assert restored_tree(back) == tree_hashes(src)

    # the same matrices written as ModelOpt writes them convert to the same Marlin experts
    ref_src = write_synthetic_checkpoint(tmp_path / "ref-src", format="nvfp4-modelopt-hf", **KW)
    ref = tmp_path / "ref"
    _cli(capsys, "nvfp4-to-marlin", ref_src, ref, "--target", "vllm", "--allow-unservable", "--workers", 1)
    ours, theirs = open_checkpoint(out), open_checkpoint(ref)
    assert [p.key for p in ours.projections] == [p.key for p in theirs.projections]
    with TensorReader(out) as a, TensorReader(ref) as b:
        for p, q in zip(ours.projections, theirs.projections, strict=True):
            for x, y in ((p.weight, q.weight), (p.scale, q.scale), (p.marlin_global, q.marlin_global)):
                assert a.read_bytes(x) == b.read_bytes(y), x.name


def test_without_its_row_the_toy_checkpoint_is_not_read(toy, tmp_path, monkeypatch):
    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-toy", **KW)
    monkeypatch.delitem(FORMATS, TOY.value)
    with pytest.raises(Exception) as err:
        open_checkpoint(src)
    assert getattr(err.value, "error_id", None) == "detect.unknown_format"
    assert table.FORMATS is FORMATS


# ------------------------------------------------------------------------------------ no branch outside it
PACKAGES = ("cli", "convert", "core", "formats", "runtime", "serving", "synth", "validate")
HOME = "core/sources/source_formats.py"


def format_branches(source: str, names: frozenset[str]) -> list[str]:
    """`line: what` for each format branch in `source`: a `SourceFormat.X` member, a comparison with a format's
    name (or a tuple of them), a dict keyed by format names (a parallel table), or `fmt.startswith/endswith`
    of part of a format's name."""
    found = []

    def is_name(node) -> bool:
        if isinstance(node, ast.Constant) and node.value in names:
            return True
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(is_name(e) for e in node.elts)

    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "SourceFormat"
                and node.attr.isupper()):
            found.append(f"{line}: SourceFormat.{node.attr}")
        elif isinstance(node, ast.Compare) and any(map(is_name, (node.left, *node.comparators))):
            found.append(f"{line}: compares with a format name")
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in names for k in node.keys):
            found.append(f"{line}: a dict keyed by format names")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and isinstance(node.func.value, ast.Name)
              and node.func.value.id in ("fmt", "format", "source_format") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append(f"{line}: {node.func.value.id}.{node.func.attr}({node.args[0].value!r})")
    return found


def test_no_format_branch_outside_the_table():
    names = frozenset(FORMATS)
    offences = [f"{path.relative_to(ROOT)}:{hit}" for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
                if path.relative_to(ROOT).as_posix() != HOME
                for hit in format_branches(path.read_text(), names)]
    assert offences == []


@pytest.mark.parametrize("line", [
    "if ckpt.format is SourceFormat.NVFP4_CT:\n    pass",
    "if fmt == 'nvfp4-ct':\n    pass",
    "ok = fmt in ('mxfp4-dsv4', 'nvfp4-modelopt-dsv4')",
    "SUFFIX = {'mxfp4-ct': 'weight_packed'}",
    "ds = fmt.endswith('dsv4')",
])
def test_the_branch_finder_sees_a_made_up_branch(line):
    assert len(format_branches(line, frozenset(FORMATS))) == 1
    clean = "row = source_format(fmt)\nif row.global_rule.reciprocal:\n    pass"
    assert format_branches(clean, frozenset(FORMATS)) == []


def test_the_docs_list_every_row():
    """docs/INSPECT.md's `format` field lists the table's names, no more and no fewer."""
    line = next(t for t in (ROOT / "docs" / "INSPECT.md").read_text().splitlines() if t.startswith("| `format` |"))
    named = {n for n in line.split("`")[1::2] if n == "marlin" or n.startswith(("nvfp4-", "mxfp4-"))}
    assert named == set(FORMATS)
