"""End to end, through the real CLI command lines: synth -> convert -> compare every tensor with the
codec module's output on the same source (the codecs are pinned to the engines by the golden cases)
-> marlin-to-source gives back the input directory byte for byte.

Substitution: the command lines run in one CLI process per step (run_cli_batch: `main(argv)` each, as the
console script runs it, its exit code, stdout and stderr; `--workers 2` forks its pool from that process, as
from a fresh one), not one process each: a process start costs more than these conversions. A step that reads
what the one before left (the round trip's tree before `--force` rewrites it, a file the user adds) starts the
next batch."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Quant, Role
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin, vllm_rescale_factor
from tests.helpers.cli import restored_tree, run_cli_batch, succeeded, tree_hashes
from tests.helpers.compare import assert_bytes_equal

CASES = [  # (synth format, command, target, act dtype, extra flags)
    ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "sglang", "bfloat16", ()),
    ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "vllm", "bfloat16", ()),
    ("nvfp4-modelopt-hf", "nvfp4-to-marlin", "vllm", "float16", ()),
    ("nvfp4-modelopt-hf", "nvfp4-to-marlin", "sglang", "float16", ()),
    ("nvfp4-ct", "nvfp4-to-marlin", "vllm", "bfloat16", ()),
    ("nvfp4-ct", "nvfp4-to-marlin", "sglang", "bfloat16", ()),
    ("mxfp4-dsv4", "mxfp4-to-marlin", "sglang", "bfloat16", ()),
    ("mxfp4-dsv4", "mxfp4-to-marlin", "vllm", "bfloat16", ("--w4a8",)),
    ("mxfp4-ct", "mxfp4-to-marlin", "vllm", "bfloat16", ()),
    ("mxfp4-gptoss", "mxfp4-to-marlin", "sglang", "bfloat16", ()),
]


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(root / file, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def _expected(src_root: Path, target: MarlinTarget) -> tuple[dict[str, torch.Tensor], set[str]]:
    """What the converter must write for each projection, computed with the codecs directly."""
    ckpt = open_checkpoint(src_root)
    stacks = defaultdict(list)
    for p in ckpt.projections:
        stacks[(p.key.rsplit(".", 2)[0], p.role is Role.DOWN)].append(p)
    expected, replaced = {}, set()
    with TensorReader(src_root) as reader:
        data = {p.key: load_projection(reader, p, fmt=ckpt.format) for p in ckpt.projections}
        for members in stacks.values():
            nv = [p for p in members if p.quant is Quant.NVFP4]
            sf = (vllm_rescale_factor([data[p.key].scale for p in nv], target.act_dtype)
                  if target.engine == "vllm" and nv else 1.0)
            for p in members:
                d = data[p.key]
                replaced.update(r.name for r in p.source_refs)
                if p.quant is Quant.NVFP4:
                    q, s = nvfp4_to_marlin(d.weight, d.scale, target=target, sf=sf)
                    expected[f"{p.key}.weight_global_scale"] = nvfp4_global_to_marlin(
                        d.global_scale, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
                    if ckpt.format is FORMATS["nvfp4-ct"]:
                        expected[f"{p.key}.weight_scale_2"] = d.global_scale
                        expected[f"{p.key}.ct_weight_global_scale"] = reader.get(p.global_scale)
                    else:
                        expected[f"{p.key}.weight_scale_2"] = reader.get(p.global_scale)
                    if p.input_scale is not None:
                        expected[p.input_scale.name] = reader.get(p.input_scale)
                else:
                    q, s = mxfp4_to_marlin(d.weight, d.scale, target=target)
                expected[f"{p.key}.weight"], expected[f"{p.key}.weight_scale"] = q, s
    return expected, replaced


_IDS = [f"{c[0]}-{c[2]}-{c[3]}{''.join(c[4])}" for c in CASES]
DEFECTS = [("negative-scale", "vllm"), ("negative-scale", "sglang"), ("subnormal-scale", "vllm"), ("zero-scale", "vllm")]
ROUND_TRIPS = [("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "vllm"), ("mxfp4-dsv4", "mxfp4-to-marlin", "sglang")]


def _workers(fmt: str, engine: str) -> tuple:
    return ("--workers", 2) if engine == "vllm" and fmt == "nvfp4-modelopt-dsv4" else ()  # the process pool


@pytest.fixture(scope="module")
def runs(synth_source, tmp_path_factory) -> dict:
    """(test, case, step) -> the CLI's answer, ("dir", test, case) -> the case's directory, ("before", test, case)
    -> its source's tree before any command ran (and, for the round trip, REV's tree before --force rewrote it)."""
    work = tmp_path_factory.mktemp("e2e")
    steps, state = {}, {}

    def case(test: str, key, src: Path, lines: dict) -> None:
        d = state["dir", test, key] = work / test / str(len(state))
        d.mkdir(parents=True)
        state["before", test, key] = tree_hashes(src)
        steps.update({(test, key, step): [a(d) if callable(a) else a for a in argv] for step, argv in lines.items()})

    for fmt, command, engine, act, extra in CASES:
        w = _workers(fmt, engine)
        case("codecs", (fmt, engine, act, extra), synth_source(fmt, experts=4, mtp=fmt.endswith("dsv4")), {
            "convert": [command, synth_source(fmt, experts=4, mtp=fmt.endswith("dsv4")), lambda d: d / "out",
                        "--target", engine, "--act-dtype", act, "--json", *w, *extra],
            "reverse": ["marlin-to-source", lambda d: d / "out", lambda d: d / "back", *w]})
    for defect, engine in DEFECTS:
        src = synth_source("nvfp4-modelopt-dsv4", experts=4, defects=(defect,))
        case("clamped", (defect, engine), src, {
            "convert": ["nvfp4-to-marlin", src, lambda d: d / "out", "--target", engine],
            "reverse": ["marlin-to-source", lambda d: d / "out", lambda d: d / "back"]})
    src = synth_source("nvfp4-modelopt-dsv4", experts=4)
    case("rescale", None, src, {"convert": ["nvfp4-to-marlin", src, lambda d: d / "out", "--target", "vllm"]})
    src = synth_source("nvfp4-modelopt-hf", experts=4)  # the dry run's OUT stays unused: the batch goes on after it
    case("dry-run", None, src, {"dry": ["nvfp4-to-marlin", src, lambda d: d / "dry" / "out", "--dry-run", "--json"],
                                "convert": ["nvfp4-to-marlin", src, lambda d: d / "out", "-q"]})
    src = synth_source("mxfp4-dsv4", experts=8, shards=2)
    case("reshard", None, src, {"convert": ["mxfp4-to-marlin", src, lambda d: d / "out", "--max-shard-size", "300KB", "-q"],
                                "reverse": ["marlin-to-source", lambda d: d / "out", lambda d: d / "back", "-q"]})
    for fmt, command, engine in ROUND_TRIPS:
        src = synth_source(fmt, experts=4)
        case("round-trip", fmt, src, {
            "convert": [command, src, lambda d: d / "a" / "out", "--target", engine, "--workers", "2", "-q"],
            "reverse": ["marlin-to-source", lambda d: d / "a" / "out", lambda d: d / "rev", "-q"],
            "again": [command, lambda d: d / "rev", lambda d: d / "b" / "out", "--target", engine, "--workers", "2", "-q"]})
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), work)))
    trips = {fmt: state["dir", "round-trip", fmt] for fmt, _, _ in ROUND_TRIPS}
    state.update({("rev", "round-trip", fmt): tree_hashes(d / "rev") for fmt, d in trips.items()})
    force = {("round-trip", fmt, "force"): ["marlin-to-source", d / "a" / "out", d / "rev", "-q", "--force"]
             for fmt, d in trips.items()}  # still recognised as this tool's output
    runs.update(zip(force, run_cli_batch(list(force.values()), work)))
    for d in trips.values():
        (d / "rev" / "notes.txt").write_text("the user's")
    refused = {("round-trip", fmt, "refused"): ["marlin-to-source", d / "a" / "out", d / "rev", "-q", "--force"]
               for fmt, d in trips.items()}
    runs.update(zip(refused, run_cli_batch(list(refused.values()), work)))
    return {**runs, **state}



@pytest.mark.parametrize("fmt,command,engine,act,extra", CASES, ids=_IDS)
def test_convert_matches_codecs_and_reverses(runs, synth_source, fmt, command, engine, act, extra):
    key = (fmt, engine, act, extra)
    out, back, before = runs["dir", "codecs", key] / "out", runs["dir", "codecs", key] / "back", runs["before", "codecs", key]
    src = synth_source(fmt, experts=4, mtp=fmt.endswith("dsv4"))
    summary = json.loads(succeeded(runs["codecs", key, "convert"]).stdout)
    assert summary["projections"] > 0 and summary["lost_scales"] == 0

    target = MarlinTarget(engine, act, "--w4a8" in extra)
    expected, replaced = _expected(src, target)
    got = _tensors(out)
    for name, value in expected.items():
        assert_bytes_equal(got[name], value, name)
    source = _tensors(src)
    passthrough = set(source) - replaced
    assert passthrough, "synth checkpoints have non-expert tensors"
    for name in passthrough:
        assert_bytes_equal(got[name], source[name], name)
    assert set(got) == set(expected) | passthrough, "no tensor is lost or invented"

    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    for rel in ("tokenizer_config.json", "generation_config.json"):
        assert (out / rel).read_bytes() == (src / rel).read_bytes()
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "marlin_fp4" and qc["marlin_layout"] == target.layout_tag
    if (src / "hf_quant_config.json").exists():
        hfq = json.loads((out / "hf_quant_config.json").read_text())
        assert hfq["quantization"] == qc and hfq["original"] == json.loads((src / "hf_quant_config.json").read_text())
    serving = (out / "SERVING.md").read_text()
    assert target.layout_tag in serving and ("--moe-runner-backend marlin" if engine == "sglang" else "--moe-backend marlin") in serving
    assert qc["original_quantization_config"] == json.loads((src / "config.json").read_text()).get("quantization_config")

    succeeded(runs["codecs", key, "reverse"])
    assert restored_tree(back) == before, "marlin-to-source gives back the input byte for byte"
    assert tree_hashes(src) == before, "the input is never modified"


@pytest.mark.parametrize("defect,engine", DEFECTS)
def test_clamped_scales_are_reported_and_restored(runs, defect, engine):
    key = (defect, engine)
    proc = succeeded(runs["clamped", key, "convert"])
    lost = "scale bytes are negative or too small" in proc.stderr
    assert lost == (defect != "zero-scale"), proc.stderr  # a zero scale is representable: nothing is lost
    proc = succeeded(runs["clamped", key, "reverse"])
    assert restored_tree(runs["dir", "clamped", key] / "back") == runs["before", "clamped", key]
    assert ("restored from the record" in proc.stdout) == lost


def test_vllm_rescale_factor_is_recorded_per_layer_stack(runs):
    proc, out = succeeded(runs["rescale", None, "convert"]), runs["dir", "rescale", None] / "out"
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("converted ")]
    assert re.search(r"\(\d+(\.\d+)? [KM]iB, vllm-L4\) in [\d.]+ s \((\d+(\.\d+)? [KMG]iB/s|too fast to time)\)", line), line
    factors = json.loads((out / "config.json").read_text())["quantization_config"]["rescale_factors"]
    assert set(factors) == {f"layers.{i}.ffn.experts.{s}" for i in range(2) for s in ("w13", "w2")}
    assert all(f >= 1 and (f & (f - 1) == 0 if isinstance(f, int) else float(f).is_integer()) for f in factors.values())


def test_dry_run_writes_nothing_and_predicts_the_size(runs):
    d = runs["dir", "dry-run", None]
    plan = json.loads(succeeded(runs["dry-run", None, "dry"]).stdout)
    assert not (d / "dry" / "out").exists() and not Path(str(d / "dry" / "out") + ".partial").exists()
    succeeded(runs["dry-run", None, "convert"])
    index = json.loads((d / "out" / "model.safetensors.index.json").read_text())
    assert plan["bytes_out"] == index["metadata"]["total_size"]


def test_max_shard_size_reshards_and_still_reverses(runs):
    d = runs["dir", "reshard", None]
    succeeded(runs["reshard", None, "convert"])
    files = sorted(p.name for p in (d / "out").glob("model-*.safetensors"))
    assert len(files) > 2 and files[0].endswith(f"-of-{len(files):05d}.safetensors")
    succeeded(runs["reshard", None, "reverse"])
    assert restored_tree(d / "back") == runs["before", "reshard", None]


@pytest.mark.parametrize("fmt, command, engine", ROUND_TRIPS)
def test_the_tool_reads_back_its_own_round_trip(runs, fmt, command, engine):
    """Issue 37 item 8: IN -> OUT -> REV -> OUT2. REV is IN exactly (same file set, same bytes: no marker file),
    REV converts again (it was refused input.reserved_name), and OUT2 is OUT byte for byte (OUT2 lies at the
    same name in another folder: SERVING.md names the output folder)."""
    d = runs["dir", "round-trip", fmt]
    for step in ("convert", "reverse", "again", "force"):  # force: REV is still recognised as this tool's output
        succeeded(runs["round-trip", fmt, step])
    assert runs["rev", "round-trip", fmt] == runs["before", "round-trip", fmt]
    assert tree_hashes(d / "b" / "out") == tree_hashes(d / "a" / "out")
    proc = runs["round-trip", fmt, "refused"]  # after the user wrote notes.txt into REV
    assert proc.returncode == 5 and "error[paths.unlisted_files]" in proc.stderr, proc.stderr
    assert (d / "rev" / "notes.txt").read_text() == "the user's"
