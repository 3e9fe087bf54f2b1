"""Issue 37 item 11, through the real CLI: the words of the messages.

- "(set DSV4_DEBUG=1 for the traceback)" only under an unexpected error, never under a typed refusal.
- Ctrl-C of a conversion without `--resume`: a fix line that says what `--resume` does.
- validate's serving-methods finding names the converter of the source's own format (MXFP4 here).
- Counts read as English: "1 shard", "x1 layer", never "1 shards" / "1 layers" / "1 errors".

Substitutions: Ctrl-C is the crash tests' step hook sending SIGINT at a tensor (tests/hooks); the
unservable converted checkpoint is a real MXFP4 conversion whose config.json then names an
architecture no family knows (the plugins' table refuses it), as a hand-edited config would. The command lines but
the Ctrl-C run's (a signal: a process of its own) run in two CLI processes, in order (run_cli_batch: `main(argv)`
each, as the console script runs it, its exit code, stdout and stderr), the conversion and what reads it, then the
edited copy's validate; not one process each: a process start costs more than these commands."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.cli import run_cli, run_cli_batch, succeeded
from tests.helpers.corrupt import copy_checkpoint, edit_json

pytestmark = pytest.mark.slow

MX = "mxfp4-dsv4"
ONE = {"layers": 1, "experts": 4, "shards": 1}
_BAD_PLURAL = re.compile(r"\b1 (shards|layers|errors|warnings|infos|experts|projections|files|tensors)\b")


REFUSED = ["nvfp4-to-marlin", "validate", "inspect"]


@pytest.fixture(scope="module")
def runs(synth_source, tmp_path_factory) -> dict:
    """step -> the CLI's answer, "dir" -> the folder: an MXFP4 source converted, the typed refusals, the dry run,
    inspect and the reverse in one CLI process; the converted copy with an unknown architecture validated in a
    second."""
    d = tmp_path_factory.mktemp("mx")
    src, out = synth_source(MX, **ONE), d / "marlin"
    steps = {"convert": ["mxfp4-to-marlin", src, out, "--workers", "1"],
             ("refused", "nvfp4-to-marlin"): ["nvfp4-to-marlin", d / "absent", d / "out"],
             ("refused", "validate"): ["validate", d / "absent"], ("refused", "inspect"): ["inspect", d / "absent"],
             "dry-run": ["mxfp4-to-marlin", src, d / "o", "--dry-run"], "inspect": ["inspect", src],
             "reverse": ["marlin-to-source", out, d / "back", "--workers", "1"]}
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), d)))
    assert runs["convert"].returncode == 0, runs["convert"].stderr
    copy = copy_checkpoint(out, d / "copy")
    edit_json(copy / "config.json", lambda c: c.__setitem__("architectures", ["UnknownMoeForCausalLM"]))
    (runs["validate-copy"],) = run_cli_batch([["validate", copy, "--json", "--workers", "1"]], d)
    return runs



def test_a_typed_refusal_has_no_debug_line(runs):
    for command in REFUSED:
        proc = runs["refused", command]
        assert proc.returncode in (2, 3) and "error[source.not_found]" in proc.stderr, proc.stderr
        assert "DSV4_DEBUG" not in proc.stderr, proc.stderr


def test_ctrl_c_without_resume_says_what_resume_does(synth_source, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", synth_source("nvfp4-modelopt-dsv4", **ONE), out, "--workers", "1", "-q",
                   env={"DSV4_CONVERT_KILL_AT": "5:INT"}, check=False)
    assert proc.returncode == 130 and "error[convert.interrupted]" in proc.stderr, proc.stderr
    fix = next(line for line in proc.stderr.splitlines() if line.startswith("  fix: "))
    assert "--resume" in fix and "continues" in fix, fix
    assert "DSV4_DEBUG" not in proc.stderr and not out.with_name("out.partial").exists()


def test_validate_names_the_converter_of_the_sources_format(runs):
    proc = runs["validate-copy"]
    findings = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "marlin.serving_methods"]
    assert findings, proc.stdout[-2000:]
    assert "mxfp4-to-marlin" in findings[0]["message"] and "nvfp4-to-marlin" not in findings[0]["message"]


def test_counts_of_one_are_singular(runs):
    texts = {"convert": runs["convert"].stderr + runs["convert"].stdout}
    texts.update({step: succeeded(runs[step]).stdout for step in ("dry-run", "inspect", "reverse")})
    assert "1 shard" in texts["dry-run"] and "x1 layer" in texts["inspect"], texts
    assert "restored 1 shard " in texts["reverse"], texts["reverse"]
    for name, text in texts.items():
        assert not _BAD_PLURAL.search(text), (name, text)
