"""No traceback from any command on any tensor name: real-looking names (`mtp.fc`, `mtp.layers.0...`,
`model.visual...`, `lm_head`, `backbone.*`, stacked and per-expert spellings with odd indices) added to a real
checkpoint, then every command run on it: inspect, plan, validate, the converter, and on its output inspect,
plan, validate and marlin-to-source (which must give the input back byte for byte). A refusal is a typed error
(docs/ERRORS.md) that names a tensor of the checkpoint; never a crash.

The commands run in-process (`main(argv)`, exactly as the console script: tests/helpers/cli_batch.py), which
makes a few hundred runs affordable; tests/cli/test_inspect.py runs the user-facing cases in subprocesses.
Substitutions: `dsv4_convert.synth` checkpoints (Qwen3-MoE ModelOpt NVFP4, DeepSeek-V4 ModelOpt NVFP4, gpt-oss
MXFP4) stand in for released weights; the added tensors hold zeros (names and shapes are what is fuzzed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import tree_hashes
from tests.helpers.cli_batch import _run

pytestmark = pytest.mark.slow  # ~1 s of commands per example

BASES = {"qwen3-moe": {"format": "nvfp4-modelopt-hf", "family": "qwen3-moe"},
         "deepseek-v4": {"format": "nvfp4-modelopt-dsv4"}, "gpt-oss": {"format": "mxfp4-gptoss"}}
CONVERT = {"qwen3-moe": "nvfp4-to-marlin", "deepseek-v4": "nvfp4-to-marlin", "gpt-oss": "mxfp4-to-marlin"}
PREFIXES = ["", "model.", "model.language_model.", "language_model.model.", "backbone.", "mtp.", "model.visual.",
            "transformer.h.", "model.layers.0.", "mtp.layers.0."]
MIDDLES = ["layers.{n}.", "{n}.", "layers.", "fc.", "blocks.{n}.", "", "mtp.", "layers.{n}.mtp."]
MODULES = ["mlp.experts.{e}.", "mixer.experts.{e}.", "block_sparse_moe.experts.{e}.", "experts.{e}.",
           "ffn.experts.{e}.", "feed_forward.experts.", "mlp.experts.", "mlp.shared_experts.", "self_attn.",
           "mlp.gate.", "", "experts."]
LEAVES = ["gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "gate_up_proj", "fc", "fc1", "qkv",
          "e_score_correction_bias", "weight", "", "experts"]
SUFFIXES = [".weight", ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_packed", ".scale", "_blocks",
            "_scales", "", ".bias", "."]
NUMBERS = ["0", "1", "3", "99999999999999999999999", "x", "-1", "\u0663", "007", ""]
REAL = ["mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.experts.0.gate_proj.weight", "model.visual.blocks.0.attn.qkv.weight", "lm_head.bias",
        "backbone.layers.1.mixer.experts.0.up_proj.weight", "backbone.embeddings.weight", "mtp", "mtp.", ".", "a..b",
        "model.layers.0.mlp.experts.e_score_correction_bias", "model.layers.0.mlp.experts.gate_up_proj",
        "model.layers.99999999999999999999.mlp.experts.0.gate_proj.weight",
        "model.layers.0.mlp.experts.99999999999999999999.gate_proj.weight",
        "mtp.0.ffn.experts.0.w1.weight", "mtp.x.ffn.experts.0.w1.weight", "layers.0.ffn.experts.0.w1.weight"]
TENSORS = {"bf16": lambda: torch.zeros(4, dtype=torch.bfloat16), "u8": lambda: torch.zeros(128, 64, dtype=torch.uint8),
           "e4m3": lambda: torch.zeros(128, 8, dtype=torch.uint8).view(torch.float8_e4m3fn),
           "f32": lambda: torch.ones((), dtype=torch.float32)}


@st.composite
def _name(draw) -> str:
    parts = [draw(st.sampled_from(x)) for x in (PREFIXES, MIDDLES, MODULES, LEAVES, SUFFIXES)]
    return "".join(parts).replace("{n}", draw(st.sampled_from(NUMBERS))).replace("{e}", draw(st.sampled_from(NUMBERS)))


NAMES = st.lists(st.tuples(st.one_of(st.sampled_from(REAL), _name()), st.sampled_from(sorted(TENSORS))),
                 min_size=1, max_size=5)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {k: write_synthetic_checkpoint(root / k, layers=1, experts=2, hidden=128, intermediate=128, shards=1, **v)
            for k, v in BASES.items()}


def _with_names(base: Path, root: Path, extra: list[tuple[str, str]]) -> Path | None:
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    tensors = {n: TENSORS[kind]() for n, kind in extra if n not in index["weight_map"]}
    if not tensors:
        return None
    save_file(tensors, str(root / "extra.safetensors"))
    index["weight_map"].update(dict.fromkeys(tensors, "extra.safetensors"))
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def _check(result: dict, names: set[str]) -> None:
    argv = " ".join(result["argv"])
    assert result["crash"] is None, f"dsv4-convert {argv} crashed:\n{result['crash']}"
    assert result["code"] in (0, 1, 2, 3, 4, 5), (argv, result["code"], result["stderr"])
    doc = json.loads(result["stdout"]) if result["stdout"].startswith("{") else {}
    err = doc.get("error") if isinstance(doc.get("error"), dict) else None
    if err and err["id"].startswith(("detect.", "group.")):  # a refusal about names names the tensor
        assert err.get("tensor") in names or any(n in (err.get("hint") or "") for n in names), (argv, err)


def _run_all(base: Path, work: Path, family: str, extra) -> None:
    src = _with_names(base, work / "src", extra)
    if src is None:
        return
    names = set(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"])
    out, back = work / "out", work / "back"
    for p in (out, back):
        shutil.rmtree(p, ignore_errors=True)
    runs = [["inspect", src, "--json"], ["plan", src, "--json"], ["validate", src, "--json"],
            [CONVERT[family], src, out, "--json", "-q", "--workers", "1", "--allow-unservable"]]
    results = [_run(list(map(str, argv))) for argv in runs]
    if results[-1]["code"] == 0:
        runs = [["inspect", out, "--json"], ["plan", out, "--json"], ["validate", out, "--json"],
                ["marlin-to-source", out, back, "--json", "-q"]]
        results += [_run(list(map(str, argv))) for argv in runs]
    for r in results:
        _check(r, names)
    if results[-1]["argv"][0] == "marlin-to-source":
        assert results[-1]["code"] == 0, results[-1]["stdout"]
        assert tree_hashes(back) == tree_hashes(src)  # the source's files exactly (no marker file)


@pytest.mark.parametrize("family", sorted(BASES))
def test_every_command_on_real_looking_names(bases, tmp_path, family):
    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(NAMES)
    def run(extra):
        _run_all(bases[family], tmp_path, family, extra)

    run()


@pytest.mark.parametrize("name", REAL)
def test_each_real_name_alone(bases, tmp_path, name):
    for kind in ("bf16", "u8"):
        _run_all(bases["qwen3-moe"], tmp_path, "qwen3-moe", [(name, kind)])
