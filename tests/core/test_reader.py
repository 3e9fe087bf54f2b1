import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.checkpoint.source_location import resolve_source
from dsv4_convert.core.checkpoint.tensor_model import Quant, Role
from dsv4_convert.core.errors import ContentError, InputError, UsageError
from dsv4_convert.core.sources.source_formats import FORMATS as ROWS
from dsv4_convert.core.sources.source_formats import source_format
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.ckpt_factory import FORMATS, make_checkpoint, write_json


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_bytes(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (what, a.dtype, b.dtype, a.shape, b.shape)
    assert _bytes(a) == _bytes(b), what


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_back_byte_identical(tmp_path, fmt):
    mtp = fmt in ("mxfp4-dsv4", "nvfp4-modelopt-dsv4", "marlin")
    built = make_checkpoint(tmp_path / fmt, fmt, mtp=mtp)
    ckpt = open_checkpoint(tmp_path / fmt)
    assert ckpt.format is source_format(fmt)
    assert set(ckpt.tensors) == set(built.tensors)
    for shard, names in built.shards.items():
        assert {n for n, r in ckpt.tensors.items() if r.file == shard} == set(names)
    assert {p.key for p in ckpt.projections} == set(built.expected)
    with TensorReader(ckpt.root) as reader:
        for name, ref in ckpt.tensors.items():
            _assert_bytes(reader.get(ref), built.tensors[name], name)
            assert reader.read_bytes(ref) == _bytes(built.tensors[name]), name
        for p in ckpt.projections:
            data = load_projection(reader, p, fmt=ckpt.format)
            packed, scale, glob = built.expected[p.key]
            if ckpt.format is ROWS["marlin"]:
                _assert_bytes(data.weight, built.tensors[f"{p.key}.weight"], p.key)
                _assert_bytes(data.scale, built.tensors[f"{p.key}.weight_scale"], p.key)
            else:
                _assert_bytes(data.weight, packed, p.key)
                want_scale = scale if p.quant is Quant.NVFP4 else scale.view(torch.uint8)
                _assert_bytes(data.scale, want_scale, p.key)
                assert (p.n, p.k) == (packed.shape[0], packed.shape[1] * 2)
            if glob is None:
                assert data.global_scale is None
            else:
                _assert_bytes(data.global_scale, glob.reshape(()).float(), p.key)


def test_modelopt_dsv4_keeps_mtp_experts_mxfp4_and_fp8_scales_passthrough(tmp_path):
    make_checkpoint(tmp_path, "nvfp4-modelopt-dsv4", mtp=True)
    ckpt = open_checkpoint(tmp_path)
    quants = {(p.layer.startswith("mtp."), p.quant) for p in ckpt.projections}
    assert quants == {(False, Quant.NVFP4), (True, Quant.MXFP4)}
    mtp = next(p for p in ckpt.projections if p.layer == "mtp.0")
    assert mtp.scale.dtype == "F8_E8M0" and mtp.global_scale is None
    trunk = next(p for p in ckpt.projections if p.layer == "0" and p.role is Role.GATE)
    assert trunk.key == "layers.0.ffn.experts.0.w1"
    assert trunk.global_scale.name.endswith("weight_scale_2") and trunk.input_scale.name.endswith("input_scale")
    passthrough = {t.name for t in ckpt.passthrough}
    assert "layers.0.ffn.shared_experts.w1.scale" in passthrough
    assert "layers.0.attn.wq_a.scale" in passthrough
    assert "layers.0.ffn.gate.tid2eid" in passthrough
    assert not passthrough & ckpt.projection_names


def test_projections_are_sorted_and_roles_follow_names(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4", layers=2, experts=2, mtp=True)
    ckpt = open_checkpoint(tmp_path)
    order = [(p.layer, p.expert, p.role.value) for p in ckpt.projections]
    assert order[:3] == [("0", 0, "gate"), ("0", 0, "up"), ("0", 0, "down")]
    assert order[-1] == ("mtp.0", 1, "down")
    w2 = next(p for p in ckpt.projections if p.role is Role.DOWN)
    assert w2.key.endswith(".w2") and (w2.n, w2.k) == (128, 64)


def test_gptoss_projection_fields(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-gptoss", layers=1, experts=2)
    ckpt = open_checkpoint(tmp_path)
    up = next(p for p in ckpt.projections if p.role is Role.UP and p.expert == 1)
    assert up.key == "model.layers.0.mlp.experts.1.up_proj"
    assert (up.expert_index, up.row_start, up.row_step, up.n, up.k) == (1, 1, 2, 64, 128)
    assert "model.layers.0.mlp.experts.gate_up_proj_bias" in {t.name for t in ckpt.passthrough}


def test_single_file_checkpoint_and_file_path(tmp_path):
    built = make_checkpoint(tmp_path, "mxfp4-dsv4", single=True)
    ckpt = open_checkpoint(tmp_path / "model.safetensors")
    assert ckpt.root == tmp_path.resolve() and ckpt.index_file is None
    assert set(ckpt.tensors) == set(built.tensors)
    assert "model.safetensors" not in ckpt.other_files


def test_other_files(tmp_path):
    make_checkpoint(tmp_path, "nvfp4-modelopt-dsv4")
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "config.json").write_text("{}")
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.other_files == ("README.md", "config.json", "hf_quant_config.json", "inference/config.json",
                                "tokenizer.json")
    assert ckpt.index_file == "model.safetensors.index.json"


def test_resolve_source_refuses_other_files_and_missing_paths(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    with pytest.raises(UsageError) as info:
        resolve_source(tmp_path / "model-00001-of-00003.safetensors")
    assert info.value.error_id == "source.not_a_directory"
    with pytest.raises(InputError) as info:
        resolve_source(tmp_path / "nope")
    assert info.value.error_id == "source.not_found"


# the fix each refusal must tell the user (docs/ERRORS.md): a key phrase of its hint
FIXES = {
    "config.not_json": "re-download or repair the config.json",
    "config.missing": "pass the checkpoint root directory",
    "index.not_json": "re-download or repair the shard index",
    "index.bad_schema": "rebuild the index",
    "index.missing_shard": "re-download the missing shards",
    "index.key_missing_in_shard": "re-download both",
    "index.key_not_in_index": "the index is stale or incomplete",
    "index.duplicate_tensor": "remove the stale copy",
    "header.offsets_past_eof": "re-download this shard",
    "checkpoint.no_weights": "sharded weights need their index",
    "detect.unknown_format": "experts are FP8",
}


def _open_fails(root, error_id: str, exc=InputError):
    with pytest.raises(exc) as info:
        open_checkpoint(root)
    assert info.value.error_id == error_id, info.value.render()
    assert FIXES[error_id] in info.value.hint, info.value.render()
    return info.value


def test_config_missing_and_not_json(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    (tmp_path / "config.json").write_text("{not json")
    e = _open_fails(tmp_path, "config.not_json")
    assert "config.json" in e.message
    (tmp_path / "config.json").unlink()
    _open_fails(tmp_path, "config.missing")


def _index(root: Path) -> dict:
    return json.loads((root / "model.safetensors.index.json").read_text())


def test_index_not_json_and_bad_schema(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    (tmp_path / "model.safetensors.index.json").write_text("{")
    _open_fails(tmp_path, "index.not_json")
    write_json(tmp_path / "model.safetensors.index.json", {"metadata": {}})
    _open_fails(tmp_path, "index.bad_schema")


def test_index_missing_shard(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    e = _open_fails(tmp_path, "index.missing_shard")
    assert "model-00002-of-00003.safetensors" in e.message


def test_index_key_missing_in_shard(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    idx = _index(tmp_path)
    idx["weight_map"]["layers.9.ffn.experts.0.w1.weight"] = "model-00001-of-00003.safetensors"
    write_json(tmp_path / "model.safetensors.index.json", idx)
    e = _open_fails(tmp_path, "index.key_missing_in_shard")
    assert e.tensor == "layers.9.ffn.experts.0.w1.weight"


def test_index_key_moved_to_wrong_shard(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    idx = _index(tmp_path)
    idx["weight_map"]["embed.weight"] = "model-00003-of-00003.safetensors"
    write_json(tmp_path / "model.safetensors.index.json", idx)
    _open_fails(tmp_path, "index.key_missing_in_shard")


def test_index_key_not_in_index(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    idx = _index(tmp_path)
    del idx["weight_map"]["norm.weight"]
    write_json(tmp_path / "model.safetensors.index.json", idx)
    e = _open_fails(tmp_path, "index.key_not_in_index")
    assert e.tensor == "norm.weight"


def test_duplicate_tensor_across_shards(tmp_path):
    from safetensors.torch import save_file
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    save_file({"norm.weight": torch.ones(128), "x": torch.ones(1)}, str(tmp_path / "extra.safetensors"))
    idx = _index(tmp_path)
    idx["weight_map"]["x"] = "extra.safetensors"
    write_json(tmp_path / "model.safetensors.index.json", idx)
    e = _open_fails(tmp_path, "index.duplicate_tensor")
    assert e.tensor == "norm.weight"


def test_truncated_shard_names_the_file(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    shard = tmp_path / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    e = _open_fails(tmp_path, "header.offsets_past_eof")
    assert e.file == str(shard) and "model-00002-of-00003.safetensors" in e.message


def test_no_weights(tmp_path):
    write_json(tmp_path / "config.json", {})
    _open_fails(tmp_path, "checkpoint.no_weights")


def test_content_errors_surface_from_open(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-dsv4")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["expert_dtype"] = "fp8"
    write_json(tmp_path / "config.json", cfg)
    _open_fails(tmp_path, "detect.unknown_format", ContentError)


# --------------------------------------------------------------------------------------- hub (offline)
def _fill_cache(hf_home: Path, repo: str, src: Path) -> Path:
    org, name = repo.split("/")
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = hf_home / "hub" / f"models--{org}--{name}"
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    return snap


def _offline(code: str, hf_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120)


def test_hub_repo_id_from_prefilled_cache_offline(tmp_path):
    make_checkpoint(tmp_path / "src", "nvfp4-modelopt-dsv4")
    snap = _fill_cache(tmp_path / "hf", "nvidia/Tiny-DSV4-NVFP4", tmp_path / "src")
    code = ("from dsv4_convert.core.checkpoint.reader import open_checkpoint\n"
            "c = open_checkpoint('nvidia/Tiny-DSV4-NVFP4')\n"
            "print(c.root); print(c.format.value); print(len(c.projections))")
    r = _offline(code, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    root, fmt, n = r.stdout.split()
    assert Path(root) == snap.resolve() and fmt == "nvfp4-modelopt-dsv4" and int(n) > 0


def test_hub_repo_not_cached_offline(tmp_path):
    (tmp_path / "hf").mkdir()
    code = ("from dsv4_convert.core.errors import InputError\n"
            "from dsv4_convert.core.checkpoint.reader import open_checkpoint\n"
            "try:\n    open_checkpoint('nobody/not-cached')\n"
            "except InputError as e:\n    print(e.error_id)\n")
    r = _offline(code, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hub.not_cached"


def _cache_tree_listing(snap: Path, extra: dict[str, int]) -> None:
    """huggingface_hub's cached tree listing (trees/<commit>.json, format 1) of the repo: every file of the
    snapshot plus `extra` (path -> size), files the Hub has but this cache never fetched."""
    files = {p.relative_to(snap).as_posix(): p.stat().st_size for p in snap.rglob("*") if p.is_file()} | extra
    trees = snap.parent.parent / "trees"
    trees.mkdir()
    write_json(trees / f"{snap.name}.json", {"format_version": 1, "files": {
        f: {"size": n, "blob_id": f"{i:040x}"} for i, (f, n) in enumerate(sorted(files.items()))}})


def test_hub_snapshot_cached_as_vllm_downloads_it_opens_offline(tmp_path):
    """Issue 20 item 7: vLLM fetches no README.md and no original/**; with the tree listing cached,
    huggingface_hub calls that snapshot incomplete. Config, index and every shard are there: it opens."""
    make_checkpoint(tmp_path / "src", "mxfp4-gptoss")
    snap = _fill_cache(tmp_path / "hf", "openai/tiny-gpt-oss", tmp_path / "src")
    for doc in snap.glob("*.md"):  # vLLM fetches weights and configs only
        doc.unlink()
    _cache_tree_listing(snap, {"README.md": 100, "original/model.safetensors": 1000, "metal/model.bin": 1000})
    code = ("from dsv4_convert.core.checkpoint.reader import open_checkpoint\n"
            "c = open_checkpoint('openai/tiny-gpt-oss')\nprint(c.root); print(c.format.value)")
    r = _offline(code, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    root, fmt = r.stdout.split()
    assert Path(root) == snap.resolve() and fmt == "mxfp4-gptoss"


def test_hub_snapshot_missing_a_shard_is_not_cached(tmp_path):
    make_checkpoint(tmp_path / "src", "mxfp4-gptoss")
    snap = _fill_cache(tmp_path / "hf", "openai/tiny-gpt-oss", tmp_path / "src")
    _cache_tree_listing(snap, {})
    shard = sorted(snap.glob("*.safetensors"))[0]
    shard.unlink()
    code = ("from dsv4_convert.core.errors import InputError\n"
            "from dsv4_convert.core.checkpoint.reader import open_checkpoint\n"
            "try:\n    open_checkpoint('openai/tiny-gpt-oss')\n"
            "except InputError as e:\n    print(e.error_id)\n")
    r = _offline(code, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hub.not_cached"


def test_original_and_metal_are_left_out_and_not_copied(tmp_path):
    src = write_synthetic_checkpoint(tmp_path / "src", format="mxfp4-gptoss", layers=1, experts=2, shards=1)
    for rel in ("original/model.safetensors", "original/config.json", "metal/model.bin"):
        (src / rel).parent.mkdir(exist_ok=True)
        (src / rel).write_bytes(b"not read by any engine")
    ckpt = open_checkpoint(src)
    assert ckpt.left_out == ("metal/model.bin", "original/config.json", "original/model.safetensors")
    assert not any(f.startswith(("original/", "metal/")) for f in ckpt.other_files)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "mxfp4-to-marlin", str(src), str(out), "--json",
                           "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["left_out"] == list(ckpt.left_out)
    assert not (out / "original").exists() and not (out / "metal").exists()


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", ""])
def test_index_paths_that_leave_the_checkpoint_are_refused(tmp_path, synth_source, shard):
    import json
    import shutil

    root = tmp_path / "ckpt"
    shutil.copytree(synth_source("mxfp4-dsv4", experts=4), root)
    root.chmod(0o755)
    index_path = root / "model.safetensors.index.json"
    index_path.chmod(0o644)
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(InputError) as e:
        open_checkpoint(root)
    assert e.value.error_id == "index.unsafe_path"
