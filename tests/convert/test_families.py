"""Model families (core/sources/naming.py, synth/families.py): every family's tiny checkpoint is recognised, converts
for both targets, validates clean (source, and output --against source) and reverses byte for byte, all through
real CLI runs on real safetensors files.

Substitutions: the checkpoints are `dsv4-convert synth --family` replicas built from the public facts named in
synth/families.py (tiny sizes, synthetic values), not the released weights. Converted outputs are made once
per session and shared by the validate and reverse tests. The converter's refusal of families the plugins do
not serve yet is lifted through DSV4_CONVERT_ALLOW_UNSERVABLE (tests/conftest.py), except in the test of the
refusal itself.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Role, TensorRef
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.files import MTP_FILE
from dsv4_convert.core.sources.detect import detect_format
from dsv4_convert.core.sources.families import family_named, family_of, module_prefix
from dsv4_convert.core.sources.naming import converted_expert, parse_expert_name
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.core.targets.served import entries
from dsv4_convert.formats.nvfp4 import quantize_nvfp4
from dsv4_convert.synth import SYNTH_FAMILIES
from dsv4_convert.synth.families import FAMILY_SPECS
from dsv4_convert.synth.nemotron import PATTERN as NEMOTRON_PATTERN
from dsv4_convert.synth.seeded import expert_matrix
from tests.helpers.cli import CLI, restored_tree, run_cli, run_cli_batch, succeeded, tree_hashes
from tests.helpers.compare import assert_bytes_equal

# deepseek-v4 and gpt-oss are covered end to end by test_convert_e2e.py; here: the families added with the table
# a replica whose config.json keeps a stale block (DeepSeek-V3-0324-FP4) is not servable as shipped: its own test
CASES = [(fam, fmt) for fam in FAMILY_SPECS for fmt in SYNTH_FAMILIES[fam] if not FAMILY_SPECS[fam].stale_block]
_IDS = [f"{fam}-{fmt}" for fam, fmt in CASES]
_SIZES = {"layers": 2, "experts": 4, "hidden": 128, "intermediate": 128, "shards": 2}
# Kimi-K3's experts run at the latent width H / 2, which vLLM's MXFP4 MoE takes unpadded from 256 (it rounds H to 256)
_FAMILY_SIZES = {"kimi-k3": {"hidden": 512}}
# the target whose output is reversed (the other one's is validated --against the source): both get exercised
_REVERSED = {case: ("sglang", "vllm")[i % 2] for i, case in enumerate(CASES)}


@pytest.fixture(scope="session")
def family_source(synth_source):
    return lambda fam, fmt: synth_source(fmt, family=fam, **{**_SIZES, **_FAMILY_SIZES.get(fam, {})})


def _converter(fmt: str) -> str:
    return "mxfp4-to-marlin" if fmt.startswith("mxfp4") else "nvfp4-to-marlin"


@pytest.fixture(scope="module")
def runs(family_source, tmp_path_factory) -> dict:
    """(family, format) -> {step: the CLI's answer}: each case's source validated, converted for both targets, the
    validated target's output checked --against the source and the reversed target's output rebuilt, all cases'
    commands in one CLI process (run_cli_batch: 175 command lines pay one torch import, not 175)."""
    work = tmp_path_factory.mktemp("fam")
    steps = {}
    for fam, fmt in CASES:
        src, out = family_source(fam, fmt), {t: work / f"{fam}-{fmt}-{t}" for t in ("vllm", "sglang")}
        reversed_target = _REVERSED[fam, fmt]
        validated_target = "vllm" if reversed_target == "sglang" else "sglang"
        steps[fam, fmt] = {
            "source": ["validate", src, "--strict", "--json"],
            **{f"convert-{t}": [_converter(fmt), src, o, "--target", t, "-q"] for t, o in out.items()},
            "against": ["validate", out[validated_target], "--against", src, "--json"],
            "reverse": ["marlin-to-source", out[reversed_target], work / f"{fam}-{fmt}-restored", "-q"],
            "paths": (src, out[validated_target], validated_target, work / f"{fam}-{fmt}-restored")}
    commands = [argv for case in steps.values() for step, argv in case.items() if step != "paths"]
    answers = iter(run_cli_batch(commands, work))
    return {case: {step: argv if step == "paths" else next(answers) for step, argv in case_steps.items()}
            for case, case_steps in steps.items()}


def _validate(proc, allowed: frozenset = frozenset()) -> dict:
    """validate's JSON report; it must pass, or fail only by error findings of the `allowed` checks."""
    report = json.loads(proc.stdout)
    errors = {f["check"] for f in report["findings"] if f["severity"] == "error"}
    ok = proc.returncode == 0 or (proc.returncode == 1 and errors and errors <= allowed)
    assert ok, f"{' '.join(proc.args)} exited {proc.returncode}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return report


@pytest.mark.parametrize(("fam", "fmt"), CASES, ids=_IDS)
def test_family_is_recognised_with_its_names(family_source, fam, fmt):
    src = family_source(fam, fmt)
    ckpt = open_checkpoint(src)
    family = family_named(FAMILY_SPECS[fam].family)  # a replica (kimi-k2) names its family
    assert family_of(ckpt.config) is family
    assert ckpt.format is FORMATS[fmt]
    assert family.scheme in ckpt.format_reason
    spec = FAMILY_SPECS[fam]
    if spec.family == "nemotron-h":  # its replicas' own layer pattern (synth/nemotron.py)
        moe_layers = [i for i, kind in enumerate(NEMOTRON_PATTERN) if kind == "E"]
    else:  # dense layers first (DeepSeek, GLM), or between the MoE layers (Llama-4 Maverick)
        moe_layers = [i for i in range(spec.dense_layers, _SIZES["layers"]) if (i + 1) % spec.moe_every == 0]
    roles = {r for rs in family.source_scheme.roles.values() for r in rs}  # Nemotron-H: non-gated, two
    assert len(ckpt.projections) == len(moe_layers) * _SIZES["experts"] * len(roles)
    for p in ckpt.projections:
        parsed = parse_expert_name(p.weight.name)
        assert parsed is not None and parsed.scheme.name == family.scheme, p.weight.name
        home = (module_prefix(family, p.layer, converted=False) if spec.layer_prefix is None  # a scheme's 2nd spelling
                else f"{spec.prefix}.{p.layer}.{family.source_scheme.module}")  # (Kimi-K2.5: language_model.model)
        assert parsed.layer == p.layer and p.key.startswith(home + ".")
        assert converted_expert(f"{p.key}.weight") == (p.layer, p.expert, p.role)  # what the plugins will read


@pytest.mark.parametrize(("fam", "fmt"), CASES, ids=_IDS)
def test_source_validates_clean(runs, fam, fmt):
    nvfp4_ple = FAMILY_SPECS[fam].ple == "nvfp4"  # SGLang cannot load NVFP4 PLE tables (core/targets/engine_config.py)
    report = _validate(runs[fam, fmt]["source"],
                       allowed=frozenset({"source.engine_config"}) if nvfp4_ple else frozenset())
    if nvfp4_ple:  # said for SGLang alone: vLLM loads them
        said = [f["message"].split(" ", 1)[0] for f in report["findings"] if f["severity"] == "error"]
        assert said == ["sglang"], report["findings"]
    if FAMILY_SPECS[fam].mtp == "file":  # GLM's mtp.safetensors: a fact, never an error or a warning
        infos = [f for f in report["findings"] if f["check"] == "structure.index.extra_file"]
        assert [f["file"] for f in infos] == [MTP_FILE] and infos[0]["severity"] == "info", infos


@pytest.mark.parametrize(("fam", "fmt"), CASES, ids=_IDS)
def test_converted_output_validates_and_reverses(runs, fam, fmt):
    case = runs[fam, fmt]
    src, out, validated_target, restored = case["paths"]
    for target in ("vllm", "sglang"):
        succeeded(case[f"convert-{target}"])
    family = family_named(FAMILY_SPECS[fam].family)
    # a family x format the plugins are not proven to serve (converted here with --allow-unservable) fails the
    # serving pre-flight (core/targets/served.py, the table the converter's gate reads too); its bytes must pass
    served = bool(entries(family.name, fmt, validated_target))
    report = _validate(case["against"], allowed=frozenset() if served else frozenset({"marlin.serving_methods"}))
    assert served or "marlin.serving_methods" in {f["check"] for f in report["findings"]}
    names = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    experts = [n for n in names if n.endswith(".weight") and converted_expert(n)]
    assert experts and all(parse_expert_name(n).scheme is family.converted_scheme for n in experts)
    if FAMILY_SPECS[fam].mtp == "file":  # copied unchanged, still outside the index
        assert (out / MTP_FILE).read_bytes() == (src / MTP_FILE).read_bytes() and MTP_FILE not in names.values()
    succeeded(case["reverse"])
    assert restored_tree(restored) == tree_hashes(src)


@pytest.mark.slow
def test_stale_block_replica_is_reported_by_validate(family_source):
    """nvidia/DeepSeek-V3-0324-FP4 keeps DeepSeek-V3's block-FP8 quantization_config beside hf_quant_config.json:
    both engines follow config.json and would build FP8 methods for its NVFP4 and BF16 layers."""
    src = family_source("deepseek-v3-0324", "nvfp4-modelopt-hf")
    proc = run_cli("validate", src, "--json", check=False)
    errors = {f["check"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
    assert proc.returncode == 1 and errors == {"structure.quant_config.stale_block"}, proc.stdout[-2000:]


def test_unservable_family_is_refused_with_the_reason(family_source, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DSV4_CONVERT_ALLOW_UNSERVABLE"}
    src = family_source("mixtral", "nvfp4-modelopt-hf")
    proc = subprocess.run([*CLI, "nvfp4-to-marlin", str(src), str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, env=env)
    err = json.loads(proc.stdout)
    assert proc.returncode == 4 and err["error"]["id"] == "convert.unservable_family", proc.stdout
    # SGLang 0.5.23 (the default target) itself refuses Mixtral: the gate quotes its reason (core/targets/served.py REFUSED)
    assert "itself cannot serve a mixtral" in err["error"]["message"], proc.stdout
    assert "QuantMixtralForCausalLM" in err["error"]["message"], proc.stdout
    assert "--allow-unservable" in err["error"]["fix"]
    assert not (tmp_path / "out").exists()


def _ref(name: str, dtype: str = "U8", shape=(64, 64)) -> TensorRef:
    return TensorRef(name, "model.safetensors", dtype, tuple(shape), 0, 0)


@pytest.mark.parametrize(("name", "part"), [
    ("model.layers.0.moe.experts.0.gate_proj.weight", "experts module 'moe.experts'"),
    ("transformer.h.0.mlp.experts.0.gate_proj.weight", "layer path 'transformer.h.0.mlp'"),
    ("model.layers.0.mlp.experts.0.fc1.weight", "'0.fc1.weight'"),
])
def test_unknown_expert_names_say_which_part_is_not_understood(name, part):
    config = {"architectures": ["X"], "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    tensors = {"model.embed_tokens.weight": _ref("model.embed_tokens.weight", "BF16"), name: _ref(name)}
    with pytest.raises(ContentError) as e:
        detect_format(config, None, tensors)
    assert e.value.error_id == "detect.unknown_format"
    assert name in e.value.hint and part in e.value.hint, e.value.hint


def test_llama4_k_major_stacks_read_as_the_per_expert_matrices(family_source):
    """The reader's transpose and gate | up split of Llama-4's K-major stacks, against an independent reference:
    each expert's matrix quantised on its own as nn.Linear stores it ([N, K], codes packed along K)."""
    src = family_source("llama4", "nvfp4-modelopt-hf")
    ckpt = open_checkpoint(src)
    assert {p.weight.name.rsplit(".", 1)[-1] for p in ckpt.projections} == {"gate_up_proj", "down_proj"}
    with TensorReader(src) as reader:
        for p in ckpt.projections:
            if p.expert not in (0, _SIZES["experts"] - 1):
                continue
            data = load_projection(reader, p)
            matrix = expert_matrix(0, p.layer, p.expert, p.role.value, p.n, p.k)
            packed, scale, _ = quantize_nvfp4(matrix, data.global_scale)
            assert_bytes_equal(data.weight, packed, p.key)
            assert_bytes_equal(data.scale, scale, f"{p.key} scale")


def test_converted_names_give_layer_expert_role_for_the_plugins():
    assert converted_expert("model.layers.3.block_sparse_moe.experts.7.w3.weight_scale") == ("3", 7, Role.UP)
    assert converted_expert("model.language_model.layers.1.mlp.experts.2.down_proj.weight") == ("1", 2, Role.DOWN)
    assert converted_expert("mtp.0.ffn.experts.5.w1.weight") == ("mtp.0", 5, Role.GATE)
    assert converted_expert("model.layers.3.mlp.shared_experts.gate_proj.weight") is None
    gemma = parse_expert_name("model.language_model.layers.4.experts.9.gate_proj.weight")
    assert (gemma.scheme.name, gemma.layer, gemma.expert, gemma.role) == ("gemma4", "4", 9, Role.GATE)
    assert gemma.scheme is family_named("gemma4-moe").source_scheme
    community = parse_expert_name("language_model.model.layers.3.mlp.experts.1.up_proj.weight_packed")
    assert (community.scheme.name, community.layer, community.expert, community.role) == (
        "hf-language-model", "3", 1, Role.UP)
    assert module_prefix(family_named("llama4"), 5) == "language_model.model.layers.5.feed_forward.experts"
