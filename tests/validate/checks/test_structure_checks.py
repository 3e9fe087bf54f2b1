"""validate/checks/structure.py, one check at a time, on real synthetic checkpoints with one defect.

Each test writes a small checkpoint with `dsv4_convert.synth` (real safetensors shards and index),
builds the checkpoint input the way the runner does, and calls the check directly; the defect's
tensors come from synth.json, the generator's own record. No substitutions.
"""

import json
import shutil

import pytest

from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks import structure as s
from tests.helpers.checks import on_disk, run, synth

CHECKS = [s.shard_headers, s.shard_truncated, s.index_missing_file, s.index_keys, s.index_extra_file,
          s.reader_refused, s.experts_missing, s.dtype_shape, s.k_alignment]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("clean") / "ckpt")[0]


@pytest.mark.parametrize("chk", CHECKS, ids=lambda c: c.id)
def test_clean_checkpoint_passes(clean, chk):
    assert run(chk, on_disk(clean)) == []


def test_missing_expert_names_the_layer_and_the_expert(tmp_path):
    root, (rec,) = synth(tmp_path / "ckpt", defects=["missing-expert"])
    (f,) = run(s.experts_missing, on_disk(root))
    assert s.experts_missing.severity_of(f) is Severity.ERROR
    assert f.tensor == rec["tensors"][0].rsplit(".", 3)[0]  # the experts container of that layer
    assert (f.layer, f.expert, f.count) == (rec["layer"], rec["expert"], 1)
    assert f"missing experts {rec['expert']}" in f.message


def test_truncated_shard_names_the_file_and_the_cut_tensors(tmp_path):
    root, (rec,) = synth(tmp_path / "ckpt", defects=["truncated-shard"])
    (f,) = run(s.shard_truncated, on_disk(root))
    assert s.shard_truncated.severity_of(f) is Severity.ERROR
    assert f.tensor == f.file == rec["file"]
    assert f"file is {rec['detail']['size']} bytes" in f.message and f.count >= 1


def test_missing_shard_is_reported_against_the_index(tmp_path):
    root, (rec,) = synth(tmp_path / "ckpt", defects=["missing-shard"])
    cin = on_disk(root)
    (f,) = run(s.index_missing_file, cin)
    assert s.index_missing_file.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.file) == ("model.safetensors.index.json", rec["file"])
    (r,) = run(s.reader_refused, cin)  # the reader refuses it too, with its own error id
    assert "[index.missing_shard]" in r.message


def test_stray_shard_is_a_warning_naming_the_file(tmp_path, clean):
    root = tmp_path / "ckpt"
    shutil.copytree(clean, root)
    shutil.copyfile(root / "model-00001-of-00002.safetensors", root / "model-old.safetensors")
    (f,) = run(s.index_extra_file, on_disk(root))
    assert s.index_extra_file.severity_of(f) is Severity.WARNING
    assert f.tensor == f.file == "model-old.safetensors"


def test_index_entry_pointing_at_the_wrong_shard(tmp_path, clean):
    root = tmp_path / "ckpt"
    shutil.copytree(clean, root)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    name = sorted(n for n, f in index["weight_map"].items() if f == "model-00001-of-00002.safetensors")[0]
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (f,) = run(s.index_keys, on_disk(root))
    assert s.index_keys.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.file) == (name, "model-00002-of-00002.safetensors")


def test_config_that_disagrees_with_the_tensor_shapes(tmp_path, clean):
    root = tmp_path / "ckpt"
    shutil.copytree(clean, root)
    config = json.loads((root / "config.json").read_text())
    config["moe_intermediate_size"] = 96
    (root / "config.json").write_text(json.dumps(config))
    cin = on_disk(root)
    found = run(s.expert_dims, cin)  # [N, K] against the config: the shared structure rule
    assert found and all(s.expert_dims.severity_of(f) is Severity.ERROR for f in found)
    first = sorted(cin.checkpoint.projections, key=lambda p: (p.weight.file, p.weight.name))
    assert {f.tensor for f in found} <= {p.weight.name for p in first}
    assert any("implies [96, 128]" in f.message or "implies [128, 96]" in f.message for f in found), [f.message for f in found]


@pytest.fixture(scope="module")
def latent(tmp_path_factory):
    """A Nemotron-3 Super replica: routed experts at moe_latent_size (64), hidden_size 128."""
    return synth(tmp_path_factory.mktemp("latent") / "ckpt", format="nvfp4-modelopt-hf", family="nemotron-3-super",
                 hidden=128, intermediate=128, experts=4, layers=2)[0]


def test_latent_moe_experts_are_checked_at_the_latent_width(latent, tmp_path):
    """core/sources/structure.py model_dims reads the experts' width from moe_latent_size, as both engines size the
    FusedMoE: clean as released; the same tensors with the key removed (hidden_size then) are the wrong matrix."""
    assert json.loads((latent / "config.json").read_text())["moe_latent_size"] == 64
    assert run(s.expert_dims, on_disk(latent)) == []
    root = tmp_path / "ckpt"
    shutil.copytree(latent, root)
    config = json.loads((root / "config.json").read_text())
    del config["moe_latent_size"]
    (root / "config.json").write_text(json.dumps(config))
    found = run(s.expert_dims, on_disk(root))
    assert found and all("H=128, I=128" in f.message for f in found), [f.message for f in found]
