"""Issue 28, items 6, 9 and 10: what the architecture needs is a structure rule. A second expert set under
another family's naming scheme (a Qwen3-MoE with `block_sparse_moe.experts.E.w1/w3/w2`) is refused at plan
time by name; an output edited to lose its output head or one expert's input scale fails validate without
--against; a NaN or zero input scale in the source is said by the converter and by validate. Real synth
checkpoints, real safetensors files, the real CLI command lines.

Substitutions: the command lines run in two CLI processes, in order (run_cli_batch: `main(argv)` each, as the
console script runs it, its exit code, stdout and stderr), the sources' then the edited outputs', not one process
each: a process start costs more than these commands. An output is validated before and after an edit as two
copies of it, one left as written, one edited. Edited outputs re-record their manifest, as a consistent attacker
would: tests/helpers/cli.py rerecord."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsv4_convert.core.files import INDEX_FILE
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import rerecord, run_cli_batch, tree_hashes

pytestmark = pytest.mark.slow  # reads the CLI's answers

ARGS = ("--workers", "1", "-q")
_W = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _load(f: Path) -> tuple[dict, dict]:
    with safe_open(f, "pt") as h:
        return h.metadata(), {k: h.get_tensor(k) for k in h.keys()}


def _edit(root: Path, edit, *, record: bool = False) -> list[str]:
    """Apply `edit(tensors) -> names it touched` to every shard, keep the index in step; re-record OUT's manifest."""
    touched = []
    index = json.loads((root / INDEX_FILE).read_text())
    for f in sorted(root.glob("*.safetensors")):
        meta, tensors = _load(f)
        before = set(tensors)
        names = edit(tensors)
        if not names:
            continue
        touched += names
        save_file(tensors, f, metadata=meta)
        for gone in before - set(tensors):
            del index["weight_map"][gone]
        if record:
            rerecord(root, f.name)
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2))
    if record:
        rerecord(root, INDEX_FILE)
    return touched


def _json(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _findings(doc: dict, check: str) -> list[dict]:
    return [f for f in doc["findings"] if f["check"] == check]


def _second_set(d: Path) -> tuple[Path, dict]:
    """A Qwen3-MoE source with a second expert set under Mixtral's names (block_sparse_moe ... w1/w3/w2)."""
    src = write_synthetic_checkpoint(d / "src", family="qwen3-moe", layers=1, experts=4, shards=1)
    extra = {}
    for f in sorted(src.glob("*.safetensors")):
        for k, t in _load(f)[1].items():
            if ".mlp.experts." in k:
                layer, rest = k.split(".mlp.experts.")
                e, proj, suffix = rest.split(".", 2)
                extra[f"{layer}.block_sparse_moe.experts.{e}.{_W[proj]}.{suffix}"] = t
    save_file(extra, src / "model-extra.safetensors", metadata={"format": "pt"})
    index = json.loads((src / INDEX_FILE).read_text())
    index["weight_map"].update(dict.fromkeys(extra, "model-extra.safetensors"))
    (src / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return src, extra


def _spoiled(d: Path, value: float) -> tuple[Path, str]:
    """A Qwen3-MoE source with one input scale set to `value`."""
    src = write_synthetic_checkpoint(d / "src", family="qwen3-moe", layers=1, experts=4, shards=1)

    def spoil(ts: dict) -> list[str]:  # one shard (shards=1): one input scale
        names = sorted(k for k in ts if k.endswith(".input_scale"))
        if names:
            ts[names[0]] = torch.full_like(ts[names[0]], value)
        return names[:1]
    (bad,) = _edit(src, spoil)
    return src, bad


def _drop_one(dropped: list):
    def drop(ts: dict) -> list[str]:  # one input scale of one expert, in the first shard that has any
        names = sorted(k for k in ts if k.endswith(".input_scale"))
        if dropped or not names:
            return []
        del ts[names[0]]
        dropped.append(names[0])
        return names[:1]
    return drop


HEADS = [("dsv4", "head.weight"), ("qwen3", "lm_head.weight")]
VALUES = [float("nan"), 0.0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, case, step) -> the CLI's answer, and (test, case, "...") -> what the test reads: the sources converted,
    validated, and the outputs made in one CLI process; the copies of those outputs, one as written, one edited,
    validated in a second."""
    base = tmp_path_factory.mktemp("needs")
    runs, steps = {}, {}
    d = base / "second-set"
    src, runs["second", None, "extra"] = _second_set(d)
    runs["second", None, "src"], runs["second", None, "before"] = src, tree_hashes(src)
    steps["second", None, "convert"] = ["nvfp4-to-marlin", src, d / "out", *ARGS, "--json"]
    steps["second", None, "validate"] = ["validate", src, "--json"]
    for name, kw in {"dsv4": {"format": "nvfp4-modelopt-dsv4"}, "qwen3": {"family": "qwen3-moe"}}.items():
        src = write_synthetic_checkpoint(base / f"src-{name}", layers=1, experts=4, shards=2, **kw)
        steps["outputs", name, "convert"] = ["nvfp4-to-marlin", src, base / f"out-{name}", *ARGS]
    for value in VALUES:
        d = base / f"spoiled-{value}"
        src, runs["invalid", str(value), "bad"] = _spoiled(d, value)
        steps["invalid", str(value), "convert"] = ["nvfp4-to-marlin", src, d / "out", "--workers", "1"]
        steps.update({("invalid", str(value), f"validate-{i}"): ["validate", root, "--json"] for i, root in enumerate((src, d / "out"))})
    runs.update(zip(steps, run_cli_batch(list(steps.values()), base)))
    for name in ("dsv4", "qwen3"):
        assert runs["outputs", name, "convert"].returncode == 0, runs["outputs", name, "convert"].stderr
    then = {}
    for name, head in HEADS:
        kept, out = (shutil.copytree(base / f"out-{name}", base / f"head-{name}" / c) for c in ("kept", "out"))
        runs["head", name, "edited"] = _edit(out, lambda ts, head=head: [head] if ts.pop(head, None) is not None else [],
                                             record=True)
        then["head", name, "kept"], then["head", name, "validate"] = ["validate", kept, "--json"], ["validate", out, "--json"]
    out = shutil.copytree(base / "out-qwen3", base / "input-scale" / "out")
    runs["input-scale", None, "edited"] = _edit(out, _drop_one([]), record=True)
    then["input-scale", None, "validate"] = ["validate", out, "--json"]
    runs.update(zip(then, run_cli_batch(list(then.values()), base)))
    return runs


def test_a_second_expert_set_in_another_scheme_is_refused_by_name(runs):
    src, extra = runs["second", None, "src"], runs["second", None, "extra"]
    out = src.parent / "out"
    proc = runs["second", None, "convert"]
    assert proc.returncode == 4, proc.stderr
    err = _json(proc)["error"]
    assert err["id"] == "convert.foreign_experts", err
    assert err["tensor"] == min(n for n in extra if n.endswith(".weight") and ".0.w1." in n), err
    assert "block_sparse_moe" in err["message"] and "mlp.experts" in err["message"], err
    assert "remove that second set" in err["fix"], err
    assert not out.exists() and not Path(f"{out}.partial").exists()
    assert tree_hashes(src) == runs["second", None, "before"]
    doc = _json(runs["second", None, "validate"])
    assert _findings(doc, "structure.experts.scheme"), doc["findings"]


@pytest.mark.parametrize("name, head", HEADS)
def test_an_output_without_its_head_fails_validate(runs, name, head):
    doc = _json(runs["head", name, "kept"])
    assert not _findings(doc, "structure.head"), doc["findings"]
    assert runs["head", name, "edited"] == [head]
    proc = runs["head", name, "validate"]
    assert proc.returncode == 1, proc.stderr
    found = _findings(_json(proc), "structure.head")
    assert [f["tensor"] for f in found] == [head], found


def test_an_output_without_one_input_scale_fails_validate(runs):
    (gone,) = runs["input-scale", None, "edited"]
    proc = runs["input-scale", None, "validate"]
    assert proc.returncode == 1, proc.stderr
    found = _findings(_json(proc), "structure.experts.input_scale")
    assert [f["tensor"] for f in found] == [gone], found


@pytest.mark.parametrize("value", VALUES)
def test_an_invalid_input_scale_is_said_by_the_converter_and_validate(runs, value):
    bad, proc = runs["invalid", str(value), "bad"], runs["invalid", str(value), "convert"]
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and bad in proc.stderr, proc.stderr
    for i in range(2):  # the source, then the output
        doc = _json(runs["invalid", str(value), f"validate-{i}"])
        found = _findings(doc, "nvfp4.input_scale.invalid")
        assert [(f["tensor"], f["severity"]) for f in found] == [(bad, "warning")], found
