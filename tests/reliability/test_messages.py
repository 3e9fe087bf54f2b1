"""Issue 37 item 11, through the real CLI: the words of the messages.

- "(set DSV4_DEBUG=1 for the traceback)" only under an unexpected error, never under a typed refusal.
- Ctrl-C of a conversion without `--resume`: a fix line that says what `--resume` does.
- validate's serving-methods finding names the converter of the source's own format (MXFP4 here).
- Counts read as English: "1 shard", "x1 layer", never "1 shards" / "1 layers" / "1 errors".

Substitutions: Ctrl-C is the crash tests' step hook sending SIGINT at a tensor (tests/hooks); the
unservable converted checkpoint is a real MXFP4 conversion whose config.json then names an
architecture no family knows (the plugins' table refuses it), as a hand-edited config would."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.corrupt import copy_checkpoint, edit_json

pytestmark = pytest.mark.slow

MX = "mxfp4-dsv4"
ONE = {"layers": 1, "experts": 4, "shards": 1}
_BAD_PLURAL = re.compile(r"\b1 (shards|layers|errors|warnings|infos|experts|projections|files|tensors)\b")


@pytest.fixture(scope="module")
def mx(synth_source, tmp_path_factory):
    src = synth_source(MX, **ONE)
    out = tmp_path_factory.mktemp("mx") / "marlin"
    proc = run_cli("mxfp4-to-marlin", src, out, "--workers", "1")
    return src, out, proc


def test_a_typed_refusal_has_no_debug_line(tmp_path):
    for argv in (["nvfp4-to-marlin", tmp_path / "absent", tmp_path / "out"], ["validate", tmp_path / "absent"],
                 ["inspect", tmp_path / "absent"]):
        proc = run_cli(*argv, check=False)
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


def test_validate_names_the_converter_of_the_sources_format(mx, tmp_path):
    _, out, _ = mx
    copy = copy_checkpoint(out, tmp_path / "copy")
    edit_json(copy / "config.json", lambda c: c.__setitem__("architectures", ["UnknownMoeForCausalLM"]))
    proc = run_cli("validate", copy, "--json", "--workers", "1", check=False)
    findings = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "marlin.serving_methods"]
    assert findings, proc.stdout[-2000:]
    assert "mxfp4-to-marlin" in findings[0]["message"] and "nvfp4-to-marlin" not in findings[0]["message"]


def test_counts_of_one_are_singular(mx, tmp_path):
    src, out, converted = mx
    texts = {"convert": converted.stderr + converted.stdout}
    texts["dry-run"] = run_cli("mxfp4-to-marlin", src, tmp_path / "o", "--dry-run").stdout
    texts["inspect"] = run_cli("inspect", src).stdout
    texts["reverse"] = run_cli("marlin-to-source", out, tmp_path / "back", "--workers", "1").stdout
    assert "1 shard" in texts["dry-run"] and "x1 layer" in texts["inspect"], texts
    assert "restored 1 shard " in texts["reverse"], texts["reverse"]
    for name, text in texts.items():
        assert not _BAD_PLURAL.search(text), (name, text)
