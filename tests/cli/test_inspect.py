import json
import os
import subprocess
import sys

import pytest
import torch

from dsv4_convert.cli.inspect import summarize
from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.sources.source_formats import source_format
from tests.helpers.ckpt_factory import FORMATS, make_checkpoint

SYNTH_FORMATS = ("mxfp4-dsv4", "nvfp4-modelopt-dsv4", "nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-ct", "mxfp4-gptoss")


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4_convert.cli", *map(str, args)], check=False,
                          capture_output=True, text=True, timeout=300, env=env)


def test_table(tmp_path):
    make_checkpoint(tmp_path, "nvfp4-modelopt-dsv4", layers=2, experts=4, mtp=True)
    r = _cli("inspect", tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.splitlines()[1].split()[:2] == ["format", "nvfp4-modelopt-dsv4"]
    assert "MTP layers       mtp.0" in out
    assert "4 x3 layers" in out
    assert "[nvfp4: 24, mxfp4: 12]" in out
    assert "group size       16, 32 (declared 16)" in out
    assert "*.attn.*" in out and "FP4 experts" in out


@pytest.mark.parametrize("fmt", FORMATS)
def test_json_document(tmp_path, fmt):
    mtp = fmt in ("mxfp4-dsv4", "nvfp4-modelopt-dsv4")
    make_checkpoint(tmp_path, fmt, layers=2, experts=4, mtp=mtp)
    doc = json.loads(json.dumps(summarize(open_checkpoint(tmp_path))))
    assert doc["schema_version"] == 1
    assert doc["format"] == fmt and doc["reason"]
    assert doc["layers"] == ["0", "1"]
    assert doc["mtp_layers"] == (["mtp.0"] if mtp else [])
    assert set(doc["experts_per_layer"].values()) == {4}
    assert doc["projections"]["total"] == 12 * (3 if mtp else 2)
    assert doc["projections"]["by_role"] == {r: 4 * (3 if mtp else 2) for r in ("down", "gate", "up")}
    assert doc["shards"] == 3 and doc["index_file"] == "model.safetensors.index.json"
    b = doc["bytes"]
    assert b["total"] == b["fp4_experts"] + b["fp4_other"] + b["fp8"] + b["bf16"] + b["other"] > 0
    assert b["fp4_experts"] > 0
    ckpt = open_checkpoint(tmp_path)
    assert doc["tensors"] == len(ckpt.tensors)
    assert b["total"] == sum(t.nbytes for t in ckpt.tensors.values())
    gate = doc["shapes_by_role"]["gate"][0]
    assert (gate["n"], gate["k"]) == (64, 128)
    assert set(doc) >= {"dtypes", "group_sizes", "declared_group_size", "quantization_config", "hf_quant_config",
                        "excluded_modules", "other_files", "root"}


def test_cli_json_is_the_documented_document(tmp_path):
    make_checkpoint(tmp_path, "mxfp4-gptoss", layers=2, experts=4)
    r = _cli("inspect", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {**json.loads(json.dumps(summarize(open_checkpoint(tmp_path)))), "exit_code": 0}


def test_help_has_an_example():
    r = _cli("inspect", "--help")
    assert r.returncode == 0 and "dsv4-convert inspect ./DeepSeek-V4-Flash" in r.stdout and "--json" in r.stdout


def test_errors_exit_with_their_class_code(tmp_path):
    r = _cli("inspect", tmp_path / "missing")
    assert r.returncode == 3 and "error[source.not_found]" in r.stderr
    make_checkpoint(tmp_path / "ck", "mxfp4-dsv4")
    shard = tmp_path / "ck" / "model-00001-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    r = _cli("inspect", tmp_path / "ck")
    assert r.returncode == 3 and "error[header.offsets_past_eof]" in r.stderr
    assert "model-00001-of-00003.safetensors" in r.stderr
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "quark"}}))
    shard.unlink()
    make_checkpoint(tmp_path / "ok", "mxfp4-dsv4")
    (tmp_path / "ok" / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "quark"}}))
    r = _cli("inspect", tmp_path / "ok")
    assert r.returncode == 4 and "error[detect.unknown_format]" in r.stderr


def test_hub_repo_id_offline(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "mxfp4-ct")
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    base = tmp_path / "hf" / "hub" / "models--org--tiny-ct"
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    r = _cli("inspect", "org/tiny-ct", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["format"] == "mxfp4-ct"
    r = _cli("inspect", "org/absent", env=env)
    assert r.returncode == 3 and "error[hub.not_cached]" in r.stderr


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_synth_then_inspect_then_read_back(tmp_path, fmt):
    from dsv4_convert.synth import write_synthetic_checkpoint

    out = tmp_path / fmt
    mtp = fmt in ("mxfp4-dsv4", "nvfp4-modelopt-dsv4")
    write_synthetic_checkpoint(out, format=fmt, layers=2, experts=4, hidden=128, intermediate=64, mtp=mtp)
    ckpt = open_checkpoint(out)
    assert ckpt.format is source_format(fmt)
    doc = summarize(ckpt)
    assert doc["format"] == fmt and doc["mtp_layers"] == (["mtp.0"] if mtp else [])
    assert len(ckpt.projections) == doc["projections"]["total"] == 4 * 3 * (3 if mtp else 2)
    with TensorReader(ckpt.root) as reader:
        for ref in ckpt.tensors.values():
            t = reader.get(ref)
            assert t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() == reader.read_bytes(ref)
        for p in ckpt.projections:
            data = load_projection(reader, p, fmt=ckpt.format)
            assert data.weight.dtype == torch.uint8 and tuple(data.weight.shape) == (p.n, p.k // 2)
            assert tuple(data.scale.shape) == (p.n, p.k // p.group_size)
            assert (data.global_scale is None) == (p.quant.value == "mxfp4")


def test_synth_cli_then_inspect_cli(tmp_path):
    out = tmp_path / "tiny"
    r = _cli("synth", out, "--format", "nvfp4-modelopt-dsv4", "--mtp")
    assert r.returncode == 0, r.stderr
    r = _cli("inspect", out, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "nvfp4-modelopt-dsv4" and doc["mtp_layers"] == ["mtp.0"]
    assert doc["projections"]["by_quant"] == {"nvfp4": 2 * 8 * 3, "mxfp4": 8 * 3}


def test_qwen35_mtp_names_are_listed_not_a_traceback(tmp_path):
    """Qwen3.5 / 3.6 and Qwen3-Next keep their draft under `mtp.fc`, `mtp.norm`, `mtp.layers.0.*` (vLLM 0.33
    qwen3_5_mtp.py): inspect lists the layer and no traceback (was int('fc') in the layer sort)."""
    from dsv4_convert.synth import write_synthetic_checkpoint

    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-hf", family="qwen3.5-moe", layers=2,
                                     experts=4, hidden=128, intermediate=128, shards=1)
    names = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    assert "mtp.fc.weight" in names
    r = _cli("inspect", src, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["mtp_layers"] == ["mtp.layers.0"]
    r = _cli("inspect", src)
    assert r.returncode == 0 and "MTP layers       mtp.layers.0" in r.stdout, r.stdout + r.stderr
def test_nvfp4_attention_is_counted_as_fp4_not_fp8(tmp_path):
    """#29 item 8: ModelOpt's NVFP4 attention (a packed U8 weight beside an F8_E4M3 block scale) was
    counted as FP8. A real safetensors shard with such a layer is added to the index."""
    from safetensors.torch import save_file

    make_checkpoint(tmp_path, "nvfp4-modelopt-hf", layers=1, experts=4)
    before = summarize(open_checkpoint(tmp_path))["bytes"]
    attn = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 32, dtype=torch.uint8),
            "model.layers.0.self_attn.q_proj.weight_scale": torch.ones(64, 4).to(torch.float8_e4m3fn)}
    save_file(attn, tmp_path / "attn.safetensors")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(attn, "attn.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    after = summarize(open_checkpoint(tmp_path))["bytes"]
    assert after["fp4_other"] - before["fp4_other"] == 64 * 32 + 64 * 4
    assert after["fp8"] == before["fp8"] and after["other"] == before["other"]
