"""Issue 37 item 5: a fix line names only flags of the command that prints it. `validate --kernel`
without a GPU said "leave --device at cpu", the converters' advice, which validate itself refuses;
marlin-to-source told the user to "pass --resume", a flag it does not have.

The walk: every `hint=` of the package (raised errors and validate's @check hints), parsed with ast.
A flag in a hint must be accepted by every command that can raise it, taken as every command whose CLI
module imports the hint's module (through any chain: tests/test_layering.py's import graph). A flag in
a backticked command line of another command (`dsv4-convert validate OUT --kernel`) must be that
command's; flags of other programs (`ray start --head`, `pip install ...`) are not ours to check.

The import chain over-approximates: where a command imports a module but can never reach the hint
(the code path needs a flag the command does not have), the pair is listed in NOT_REACHED with the
reason. The last test shows the walk failing on a made-up hint.

Substitutions: none; the commands' accepted flags are click's own parameters of each command."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from dsv4_convert.cli import commands
from tests.test_layering import ROOT, import_graph, package_dirs

pytestmark = pytest.mark.slow  # loads every command (torch, numba)

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
BACKTICKED = re.compile(r"`([^`]*)`")

# (file, flag, command): why the command, although it imports the module, never prints that hint
NOT_REACHED = {
    ("cli/options.py", "--device", "plan"): "refuse_gpu_device is called by the converters only",
    ("cli/options.py", "--device", "marlin-to-source"): "refuse_gpu_device is called by the converters only",
    ("convert/pipeline.py", "--resume", "marlin-to-source"): "reverse imports pipeline's _report only",
    ("convert/plan.py", "--act-dtype", "marlin-to-source"): "reverse imports plan's kept_input_name only",
    ("convert/plan.py", "--w4a8", "marlin-to-source"): "reverse imports plan's kept_input_name only",
    ("convert/plan.py", "--tp", "marlin-to-source"): "reverse imports plan's kept_input_name only",
    ("convert/plan.py", "--ep", "marlin-to-source"): "reverse imports plan's kept_input_name only",
    ("convert/plan.py", "--allow-unservable", "marlin-to-source"): "reverse imports plan's kept_input_name only",
    ("convert/plan.py", "--w4a8", "nvfp4-to-marlin"): "convert.w4a8_nvfp4 needs a W4A8 target, which only "
                                                       "mxfp4-to-marlin --w4a8 makes",
    ("runtime/executors.py", "--device", "plan"): "refuse_device is called by validate only",
    ("runtime/executors.py", "--device", "marlin-to-source"): "refuse_device is called by validate only",
    ("runtime/executors.py", "--executor", "plan"): "refuse_device is called by validate only",
    ("runtime/ray_executor.py", "--ray-address", "plan"): "the Ray executor runs only under --executor ray, which "
                                                          "plan does not have",
    ("runtime/output/tree.py", "--resume", "marlin-to-source"): "only when OutputTree(resumable=True): marlin-to-source "
                                                                 "builds it with resumable=False",
    ("runtime/output/tree.py", "--resume", "synth"): "only when OutputTree(resumable=True): synth builds it with "
                                                     "resumable=False",
}


def _text(node) -> str | None:
    """The literal text of a hint expression: a string, an f-string's literal parts, a concatenation,
    both branches of a conditional; None when it is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp):
        return (_text(node.left) or "") + (_text(node.right) or "")
    if isinstance(node, ast.IfExp):
        return (_text(node.body) or "") + " | " + (_text(node.orelse) or "")
    return None


def hints(root: Path = ROOT):
    """(file, line, module, text) of every hint= with literal text in the package."""
    for layer, folder in package_dirs(root).items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join(["dsv4_convert", layer, *parts])
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.keyword) and node.arg == "hint" and (text := _text(node.value)):
                    yield path.relative_to(root).as_posix(), node.lineno, module, text


def named_flags(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """(flags the hint names for its own command, {other command: flags named in its backticked line})."""
    own, others = set(), {}
    for span in BACKTICKED.findall(text):
        words = span.split()
        if words[:1] == ["dsv4-convert"] and len(words) > 1:
            others.setdefault(words[1], set()).update(FLAG.findall(span))
    bare = BACKTICKED.sub(lambda m: m.group(1) if m.group(1).startswith("--") else " ", text)  # `--resume` stays
    own |= set(FLAG.findall(bare))
    return own, others


def violations(found, reach: dict[str, set[str]], accepted: dict[str, set[str]]) -> list[str]:
    bad = []
    for file, line, module, text in found:
        own, others = named_flags(text)
        for command, flags in others.items():
            bad += [f"{file}:{line}: `dsv4-convert {command}` has no {f}" for f in sorted(flags - accepted.get(command, set()))]
        for command in sorted(c for c, modules in reach.items() if module in modules):
            for flag in sorted(own - accepted[command]):
                if (file, flag, command) not in NOT_REACHED:
                    bad.append(f"{file}:{line}: {command} can print this hint, which names {flag}; {command} has no {flag}")
    return bad


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


@pytest.fixture(scope="module")
def cli_facts():
    graph = import_graph()
    reach, accepted = {}, {}
    for name, module, _, _ in commands.ALL:
        reach[name] = _closure(graph, module)
        accepted[name] = {"--help"} | {o for p in commands.load(name).params for o in (*p.opts, *p.secondary_opts)
                                       if o.startswith("--")}  # --help: click's own, on every command
    return reach, accepted


def test_every_hint_names_only_flags_of_the_commands_that_print_it(cli_facts):
    reach, accepted = cli_facts
    found = list(hints())
    assert len(found) > 100 and any("--resume" in t for *_, t in found)  # the scan finds the hints
    assert not violations(found, reach, accepted), "\n".join(violations(found, reach, accepted))


def test_every_not_reached_entry_is_still_needed(cli_facts):
    """An entry the walk no longer needs goes (so the list cannot hide a later real case)."""
    reach, accepted = cli_facts
    needed = set()
    for file, _, module, text in hints():
        own, _ = named_flags(text)
        needed |= {(file, f, c) for c, modules in reach.items() if module in modules for f in own - accepted[c]}
    assert set(NOT_REACHED) <= needed, sorted(set(NOT_REACHED) - needed)


def test_the_walk_fails_on_a_made_up_hint():
    reach = {"validate": {"dsv4_convert.runtime.device"}, "inspect": {"dsv4_convert.core.x"}}
    accepted = {"validate": {"--kernel", "--device"}, "inspect": {"--json"}}
    made_up = [("runtime/device.py", 1, "dsv4_convert.runtime.device", "or leave --device at cpu, or pass --resume"),
               ("core/x.py", 2, "dsv4_convert.core.x", "run `dsv4-convert validate OUT --kernel --against SRC`"),
               ("core/x.py", 3, "dsv4_convert.core.x", "`ray start --head`, then pass --json")]
    bad = violations(made_up, reach, accepted)
    assert bad == ["runtime/device.py:1: validate can print this hint, which names --resume; validate has no --resume",
                   "core/x.py:2: `dsv4-convert validate` has no --against"], bad


def test_validate_kernel_without_a_gpu_says_where_kernel_runs(synth_source):
    """The fix line of `device.no_gpu` under validate: where --kernel runs and that validate without it
    needs no GPU; never the converters' "leave --device at cpu" (validate --kernel refuses cpu)."""
    import torch

    from tests.helpers.cli import run_cli
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    src = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4)
    for extra in ([], ["--device", "cuda:0"]):
        proc = run_cli("validate", src, "--kernel", *extra, "--json", check=False)
        err = json.loads(proc.stdout)["error"]
        assert proc.returncode == 2 and err["id"] == "device.no_gpu", proc.stdout
        assert "drop --kernel" in err["fix"] and "--device at cpu" not in err["fix"], err["fix"]


def test_marlin_to_source_onto_an_interrupted_run_never_says_resume(synth_source, tmp_path):
    """OUT.partial left by a killed run (a conversion SIGKILLed at its 5th tensor), then marlin-to-source
    onto the same OUT: refused, and the fix names --force only (marlin-to-source has no --resume)."""
    from tests.helpers.cli import run_cli
    src = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4)
    converted, out = tmp_path / "marlin", tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, converted, "-q", "--workers", "1")
    killed = run_cli("nvfp4-to-marlin", src, out, "-q", "--workers", "1", env={"DSV4_CONVERT_KILL_AT": "5"}, check=False)
    assert killed.returncode < 0 and out.with_name("out.partial").is_dir(), killed.stderr
    proc = run_cli("marlin-to-source", converted, out, "--json", check=False)
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 5 and err["id"] == "output.interrupted_run", proc.stdout
    assert "--resume" not in err["fix"] and "--force" in err["fix"], err["fix"]
