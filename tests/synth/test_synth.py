"""`synth`: every format loads, matches the spec's names/dtypes/shapes, is deterministic, dequantizes
to the matrices it came from, and carries each defect exactly where synth.json says."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dsv4_convert.core.errors import OutputError, UsageError
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.formats.mxfp4 import dequantize_mxfp4
from dsv4_convert.formats.nvfp4 import dequantize_nvfp4, global_from_ct
from dsv4_convert.synth import SYNTH_FORMATS, write_synthetic_checkpoint
from dsv4_convert.synth.defects import DEFECTS
from dsv4_convert.synth.experts import expert_slot
from dsv4_convert.synth.layouts import Dims
from dsv4_convert.synth.seeded import expert_matrix

SMALL = {"layers": 1, "experts": 6, "hidden": 64, "intermediate": 64, "shards": 2}


def header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def load_all(root: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                out[k] = f.get_tensor(k)
    return out


def manifest(root: Path) -> dict:
    return json.loads((root / "synth.json").read_text())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("synth")
    return {f: write_synthetic_checkpoint(base / f, format=f, mtp=f.endswith("dsv4")) for f in SYNTH_FORMATS}


# (weight dtype, weight shape, scale dtype, scale shape, global dtype, global shape) for w1/gate, H=256, I=128
EXPECTED_GATE = {
    "mxfp4-dsv4": ("I8", [128, 128], "F8_E8M0", [128, 8], None, None),
    "nvfp4-modelopt-dsv4": ("U8", [128, 128], "F8_E4M3", [128, 16], "F32", []),
    "nvfp4-modelopt-hf": ("U8", [128, 128], "F8_E4M3", [128, 16], "F32", []),
    "nvfp4-ct": ("U8", [128, 128], "F8_E4M3", [128, 16], "F32", [1]),
    "nvfp4-ct-mxfp8": ("U8", [128, 128], "F8_E4M3", [128, 16], "F32", [1]),  # MiniMax-M3.1: compressed-tensors experts
    "mxfp4-ct": ("U8", [128, 128], "U8", [128, 8], None, None),
    "mxfp4-gptoss": ("U8", [8, 256, 8, 16], "U8", [8, 256, 8], None, None),
}


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_loadable_and_index_complete(ckpts, fmt):
    root = ckpts[fmt]
    index = json.loads((root / "model.safetensors.index.json").read_text())
    seen: dict[str, str] = {}
    total = 0
    for shard in sorted(root.glob("model-*.safetensors")):
        h = header(shard)
        assert h.pop("__metadata__") == {"format": "pt"}
        for name, info in h.items():
            assert name not in seen, f"{name} in {seen.get(name)} and {shard.name}"
            seen[name] = shard.name
            total += info["data_offsets"][1] - info["data_offsets"][0]
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == total == manifest(root)["total_size"]
    assert len(load_all(root)) == len(seen) == manifest(root)["tensors"]
    assert [p.name for p in sorted(root.glob("model-*.safetensors"))] == [
        f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    assert (root / "tokenizer_config.json").exists() and (root / "generation_config.json").exists()
    assert not list(root.parent.glob(f"{fmt}.partial*"))


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_expert_dtypes_and_shapes(ckpts, fmt):
    root = ckpts[fmt]
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    slot = expert_slot(fmt, "0", 0, "gate")
    wd, ws, sd, ss, gd, gs = EXPECTED_GATE[fmt]

    def info(name):
        return header(root / index[name])[name]

    assert (info(slot.weight)["dtype"], info(slot.weight)["shape"]) == (wd, ws)
    assert (info(slot.scale)["dtype"], info(slot.scale)["shape"]) == (sd, ss)
    if gd:
        assert (info(slot.global_scale)["dtype"], info(slot.global_scale)["shape"]) == (gd, gs)
        assert (info(slot.input_scale)["dtype"], info(slot.input_scale)["shape"]) == (gd, gs)
    else:
        assert slot.global_scale is None
    if fmt != "mxfp4-gptoss":
        down = expert_slot(fmt, "0", 7, "down")
        assert info(down.weight)["shape"] == [256, 64]
    # experts of a layer spread over more than one shard
    files = {f for n, f in index.items() if ".experts." in n}
    assert len(files) >= 2


def test_dsv4_tree_and_config(ckpts):
    root = ckpts["mxfp4-dsv4"]
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    dtypes = {}
    for shard in set(index.values()):
        dtypes.update({k: (v["dtype"], v["shape"]) for k, v in header(root / shard).items() if k != "__metadata__"})
    assert dtypes["embed.weight"] == ("BF16", [512, 256]) and dtypes["head.weight"] == ("BF16", [512, 256])
    assert dtypes["layers.0.attn.wq_a.weight"] == ("F8_E4M3", [128, 256])
    assert dtypes["layers.0.attn.wq_a.scale"] == ("F8_E8M0", [1, 2])
    assert dtypes["layers.0.attn.wkv.scale"] == ("F8_E8M0", [1, 2])  # ceil(64/128) = 1
    assert dtypes["layers.0.ffn.gate.tid2eid"] == ("I64", [512, 6])
    assert "layers.0.ffn.gate.bias" not in dtypes and dtypes["layers.1.ffn.gate.bias"] == ("F32", [8])
    assert dtypes["layers.1.ffn.shared_experts.w2.weight"] == ("F8_E4M3", [256, 128])
    assert dtypes["mtp.0.e_proj.weight"][0] == "F8_E4M3" and dtypes["mtp.0.enorm.weight"][0] == "BF16"
    assert dtypes["mtp.0.ffn.experts.3.w1.scale"] == ("F8_E8M0", [128, 8])
    cfg = json.loads((root / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV4ForCausalLM"] and cfg["expert_dtype"] == "fp4"
    assert cfg["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    assert (cfg["num_nextn_predict_layers"], cfg["num_hash_layers"], cfg["n_routed_experts"]) == (1, 1, 8)


def test_modelopt_dsv4_config_and_mtp(ckpts):
    root = ckpts["nvfp4-modelopt-dsv4"]
    hq = json.loads((root / "hf_quant_config.json").read_text())
    assert hq["producer"] == {"name": "modelopt", "version": "dsv4-nvfp4-experts"}
    q = hq["quantization"]
    assert q["quant_algo"] == "MIXED_PRECISION" and q["group_size"] == 16
    assert q["quantized_layers"] == {f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16}
                                     for i in range(2)}
    assert "mtp.*" in q["exclude_modules"]
    qc = json.loads((root / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["moe_quant_algo"], qc["quant_algo"]) == ("fp8", "NVFP4", "MIXED_PRECISION")
    assert qc["ignore"] == q["exclude_modules"] and "exclude_modules" not in qc
    t = load_all(root)
    assert "layers.0.ffn.experts.0.w1.scale" not in t
    assert t["mtp.0.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert t["mtp.0.ffn.experts.0.w1.scale"].dtype == torch.float8_e8m0fnu
    assert "mtp.0.ffn.experts.0.w1.weight_scale" not in t
    assert t["layers.0.ffn.shared_experts.w1.scale"].dtype == torch.float8_e8m0fnu


@pytest.mark.parametrize("fmt", ["nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-ct", "mxfp4-gptoss"])
def test_hf_configs(ckpts, fmt):
    qc = json.loads((ckpts[fmt] / "config.json").read_text())["quantization_config"]
    if fmt == "nvfp4-modelopt-hf":
        assert (qc["quant_method"], qc["quant_algo"]) == ("modelopt", "NVFP4")
        hq = json.loads((ckpts[fmt] / "hf_quant_config.json").read_text())["quantization"]
        assert hq["quant_algo"] == "NVFP4" and hq["group_size"] == 16 and "lm_head" in hq["exclude_modules"]
    elif fmt.endswith("-ct"):
        assert qc["quant_method"] == "compressed-tensors"
        assert qc["format"] == qc["config_groups"]["group_0"]["format"] == f"{fmt[:5]}-pack-quantized"
    else:
        assert qc["quant_method"] == "mxfp4" and "lm_head" in qc["modules_to_not_convert"]


def _dequant(fmt: str, t: dict, layer: str, expert: int, role: str) -> torch.Tensor:
    s = expert_slot(fmt, layer, expert, role)
    if s.index is not None:
        e, row, step = s.index
        w, sc = t[s.weight][e, row::step], t[s.scale][e, row::step]
        return dequantize_mxfp4(w.reshape(w.shape[0], -1), sc)
    if s.global_scale is None:
        return dequantize_mxfp4(t[s.weight], t[s.scale])
    g = t[s.global_scale]
    reciprocal = FORMATS[fmt].global_rule.reciprocal  # compressed-tensors rows (nvfp4-ct, nvfp4-ct-mxfp8)
    return dequantize_nvfp4(t[s.weight], t[s.scale], global_from_ct(g) if reciprocal else g)


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_dequantizes_to_the_seeded_matrices(ckpts, fmt):
    t = load_all(ckpts[fmt])
    for layer, expert, role in (("0", 0, "gate"), ("1", 7, "up"), ("1", 3, "down")):
        n, k = (256, 128) if role == "down" else (128, 256)
        w = expert_matrix(0, layer, expert, role, n, k)
        dq = _dequant(fmt, t, layer, expert, role)
        rel = ((dq - w).norm() / w.norm()).item()
        assert rel < 0.2, f"{fmt} {layer}/{expert}/{role}: relative error {rel:.3f}"


@pytest.mark.parametrize("fmt", ["nvfp4-modelopt-dsv4", "nvfp4-modelopt-hf", "nvfp4-ct"])
def test_gate_and_up_share_one_global(ckpts, fmt):
    t = load_all(ckpts[fmt])
    gate, up, down = (expert_slot(fmt, "1", 2, r) for r in ("gate", "up", "down"))
    assert torch.equal(t[gate.global_scale], t[up.global_scale])
    assert torch.equal(t[gate.input_scale], t[up.input_scale])
    assert not torch.equal(t[gate.global_scale], t[down.global_scale])


def test_gptoss_rows_are_interleaved(ckpts):
    from dsv4_convert.formats.mxfp4 import quantize_mxfp4
    t = load_all(ckpts["mxfp4-gptoss"])
    blocks = t["model.layers.0.mlp.experts.gate_up_proj_blocks"][2].reshape(256, 128)
    for row0, role in ((0, "gate"), (1, "up")):
        packed, _ = quantize_mxfp4(expert_matrix(0, "0", 2, role, 128, 256))
        assert torch.equal(blocks[row0::2], packed)


def test_deterministic(tmp_path):
    a = write_synthetic_checkpoint(tmp_path / "a", format="nvfp4-ct", **SMALL)
    b = write_synthetic_checkpoint(tmp_path / "b", format="nvfp4-ct", **SMALL)
    c = write_synthetic_checkpoint(tmp_path / "c", format="nvfp4-ct", seed=1, **SMALL)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    shards = [n for n in names if n.startswith("model-")]
    assert all((a / n).read_bytes() != (c / n).read_bytes() for n in shards)


def _applicable():
    return [(d.name, f) for d in DEFECTS.values() for f in d.formats]


@pytest.mark.parametrize("defect,fmt", _applicable())
def test_defect_is_where_the_manifest_says(tmp_path, defect, fmt):
    small = dict(SMALL, intermediate=32) if defect == "reshaped-down" else SMALL  # H == I: no reshape to see
    root = write_synthetic_checkpoint(tmp_path / "x", format=fmt, defects=[defect], **small)
    (rec,) = manifest(root)["defects"]
    assert rec["defect"] == defect
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    if defect == "missing-shard":
        assert rec["file"] in set(index.values()) and not (root / rec["file"]).exists()
        return
    if defect == "truncated-shard":
        assert (root / rec["file"]).stat().st_size == rec["detail"]["size"] < rec["detail"]["original_size"]
        return
    if defect == "missing-expert":
        assert rec["tensors"] and not any(n in index for n in rec["tensors"])
        return
    if defect in ("config-intermediate", "experts-beyond-config"):
        config = json.loads((root / "config.json").read_text())
        was = rec["detail"]["original"]
        assert config[rec["detail"]["key"]] == (2 * was if defect == "config-intermediate" else was - 1)
        return
    clean = load_all(write_synthetic_checkpoint(tmp_path / "clean", format=fmt, **small))
    t = load_all(root)
    name = rec["tensors"][0]
    assert index[name] == rec["file"]
    raw, ref = (x[name].view(torch.uint8) if x[name].element_size() == 1 else x[name] for x in (t, clean))
    if rec["positions"]:
        changed = torch.nonzero(raw != ref).tolist()
        assert sorted(changed) == sorted(rec["positions"])
        got = [raw[tuple(p)].item() for p in rec["positions"]]
        want = {"nan-scale": [0x7F], "zero-scale": [0], "e8m0-nan": [0xFF], "e8m0-overflow": [253],
                "subnormal-scale": [1, 2, 3, 4], "negative-scale": [ref[tuple(rec["positions"][0])].item() | 0x80]}
        assert got == want[defect]
    elif defect == "swapped-nibbles":
        s = expert_slot(fmt, "0", rec["expert"], "down")
        region, before = raw, ref
        if s.index is not None:
            region, before = raw[s.index[0]], ref[s.index[0]]
        assert torch.equal(((region & 0xF) << 4) | (region >> 4), before)
        assert (raw != ref).sum() == (region != before).sum()
    elif defect == "nan-global":
        assert torch.isnan(t[name]).all()
    elif defect == "global-mismatch":
        g_gate, g_up = (t[n] for n in rec["tensors"])
        assert not torch.equal(g_gate, g_up) and rec["detail"]["globals"][0] != rec["detail"]["globals"][1]
    elif defect == "all-zero-expert":
        dq = _dequant(fmt, t, "0", rec["expert"], "gate")
        assert (dq == 0).all()
    elif defect in ("reshaped-down", "empty-expert"):
        inner = clean[rec["tensors"][0]].shape[1] * 2  # I, from the clean down weight [H, I/2]
        for n in rec["tensors"]:
            got, orig = t[n], clean[n]
            if defect == "empty-expert":
                assert tuple(got.shape) == (0, orig.shape[1])
            else:  # same bytes, the gate/up shape
                assert tuple(got.shape) == (inner, orig.numel() // inner) != tuple(orig.shape)
                assert torch.equal(got.reshape(-1).view(torch.uint8), orig.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("defects,fmt,match", [
    (["e8m0-nan"], "nvfp4-ct", "does not apply"),
    (["nan-scale"], "mxfp4-dsv4", "does not apply"),
    (["missing-expert"], "mxfp4-gptoss", "does not apply"),
    (["no-such-defect"], "nvfp4-ct", "unknown defect"),
    (["nan-scale", "nan-scale"], "nvfp4-ct", "more than once"),
    (["truncated-shard", "missing-shard"], "nvfp4-ct", "last shard"),
    (["reshaped-down"], "nvfp4-ct", "hidden != --intermediate"),  # SMALL has H == I
])
def test_bad_defects_refused(tmp_path, defects, fmt, match):
    with pytest.raises(UsageError, match=match):
        write_synthetic_checkpoint(tmp_path / "x", format=fmt, defects=defects, **SMALL)
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


def test_defects_combine(tmp_path):
    names = ["nan-scale", "negative-scale", "zero-scale", "missing-expert", "swapped-nibbles", "global-mismatch",
             "all-zero-expert", "truncated-shard"]
    root = write_synthetic_checkpoint(tmp_path / "x", format="nvfp4-modelopt-dsv4", defects=names, **SMALL)
    assert [r["defect"] for r in manifest(root)["defects"]] == names
    with pytest.raises(UsageError, match="both hit expert"):
        write_synthetic_checkpoint(tmp_path / "y", format="nvfp4-ct", defects=["nan-scale", "zero-scale"],
                                   **{**SMALL, "experts": 1})


def test_bad_arguments_refused(tmp_path):
    with pytest.raises(UsageError, match="multiple of 32"):
        write_synthetic_checkpoint(tmp_path / "x", hidden=48)
    with pytest.raises(UsageError, match="--mtp needs"):
        write_synthetic_checkpoint(tmp_path / "x", format="nvfp4-ct", mtp=True)
    with pytest.raises(UsageError, match="unknown format"):
        write_synthetic_checkpoint(tmp_path / "x", format="fp8")


def test_existing_out_refused_unless_force(tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputError):
        write_synthetic_checkpoint(out, format="mxfp4-ct", **SMALL)
    assert (out / "keep.txt").exists()
    with pytest.raises(OutputError, match="not written by dsv4-convert"):  # --force never deletes others' files
        write_synthetic_checkpoint(out, format="mxfp4-ct", force=True, **SMALL)
    assert (out / "keep.txt").exists()
    mine = tmp_path / "mine"
    write_synthetic_checkpoint(mine, format="mxfp4-ct", **SMALL)
    write_synthetic_checkpoint(mine, format="nvfp4-ct", force=True, **SMALL)  # our own output: replaced
    assert json.loads((mine / "synth.json").read_text())["format"] == "nvfp4-ct"
    empty = tmp_path / "empty"
    empty.mkdir()
    write_synthetic_checkpoint(empty, format="mxfp4-ct", **SMALL)


def test_synth_writes_through_the_output_tree(tmp_path):
    """Issue 38: synth stages, locks and publishes through runtime/output/ as the converters do: a run whose
    OUT another run is writing is refused (output.locked) and leaves that run's staging directory alone; a
    killed run's staging directory is refused without --force, and replaced with it."""
    from dsv4_convert.runtime.output import OutputTree

    out = tmp_path / "x"
    other = OutputTree(out, resumable=False)
    other.open("another run")
    try:
        with pytest.raises(OutputError) as e:
            write_synthetic_checkpoint(out, format="mxfp4-ct", **SMALL)
        assert e.value.error_id == "output.locked" and other.path.is_dir() and not out.exists()
    finally:
        other._locks.release()  # the other run dies: its lock goes, its staging directory stays
    with pytest.raises(OutputError) as e:
        write_synthetic_checkpoint(out, format="mxfp4-ct", **SMALL)
    assert e.value.error_id == "output.interrupted_run" and "--resume" not in e.value.hint
    write_synthetic_checkpoint(out, format="mxfp4-ct", force=True, **SMALL)
    assert json.loads((out / "synth.json").read_text())["format"] == "mxfp4-ct" and not other.path.exists()
    assert "dsv4-convert.lock" not in json.loads((out / "synth.json").read_text())["written"]


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_real_size_layout_with_tiny_dims(tmp_path, fmt):
    dims = Dims(layers=1, experts=4, hidden=128, intermediate=64, hash_layers=0, mtp=False)
    seen = []
    root = write_synthetic_checkpoint(tmp_path / "r", format=fmt, real_size=True, real_size_dims=dims,
                                      shard_bytes=8 << 10, progress=lambda n, total: seen.append(n))
    m = manifest(root)
    assert m["real_size"] and m["random_codes"] and len(m["files"]) >= 2
    assert sum(seen) == m["total_size"]
    t = load_all(root)
    assert len(t) == m["tensors"]
    s = expert_slot(fmt, "0", 3, "down")
    scale = t[s.scale].view(torch.uint8)
    if fmt.startswith("mxfp4"):
        assert int(scale.min()) >= 118 and int(scale.max()) <= 130
    else:
        assert torch.isfinite(t[s.scale].float()).all() and (t[s.scale].float() > 0).all()
        gate, up = expert_slot(fmt, "0", 3, "gate"), expert_slot(fmt, "0", 3, "up")
        assert torch.equal(t[gate.global_scale], t[up.global_scale])
    if s.index is None:
        assert tuple(t[s.weight].shape) == (128, 32)
    else:
        assert tuple(t[s.weight].shape) == (4, 128, 2, 16)


@pytest.mark.parametrize("fmt", SYNTH_FORMATS)
def test_real_size_output_meets_every_structure_rule(tmp_path, fmt):
    """The benchmarks convert real-size layers: the converter's structure rules (the output head included)
    must hold, or `nvfp4-to-marlin` refuses them."""
    from dsv4_convert.core.checkpoint.reader import open_checkpoint
    from dsv4_convert.core.sources.structure import RULES

    dims = Dims(layers=1, experts=4, hidden=128, intermediate=64, hash_layers=0, mtp=False)
    root = write_synthetic_checkpoint(tmp_path / "r", format=fmt, real_size=True, real_size_dims=dims)
    ckpt = open_checkpoint(root)
    assert [(rule.check_id, v) for rule in RULES for v in rule(ckpt)] == []


def test_real_size_refuses_defects(tmp_path):
    with pytest.raises(UsageError, match="real-size"):
        write_synthetic_checkpoint(tmp_path / "r", real_size=True, defects=["nan-scale"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "synth", *args], check=False,
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_and_refuses_existing(tmp_path, capsys):
    out = tmp_path / "c"
    r = _cli(str(out), "--format", "mxfp4-dsv4", "--layers", "1", "--experts", "4", "--hidden", "64",
             "--intermediate", "64", "--shards", "2", "--mtp", "--defect", "e8m0-nan")
    assert r.returncode == 0, r.stderr
    m = manifest(out)
    assert r.stdout.strip() == (f"wrote {out} (mxfp4-dsv4): 2 files, {m['tensors']} tensors, "
                                f"{m['total_size']:,} bytes, defects: e8m0-nan")
    code, _, err = _main(capsys, str(out), "--format", "mxfp4-dsv4")  # in-process: saves a torch import
    assert code == 5 and "already exists" in err and manifest(out) == m

def _main(capsys, *args) -> tuple[int, str, str]:
    from dsv4_convert.cli.main import main
    try:
        main(["synth", *args])
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_usage_errors_and_help(tmp_path, capsys):
    code, _, err = _main(capsys, str(tmp_path / "d"), "--format", "nvfp4-ct", "--defect", "e8m0-nan")
    assert code == 2 and "does not apply" in err and not (tmp_path / "d").exists()
    code, out, _ = _main(capsys, "--help")
    assert code == 0 and "--real-size" in out and "swapped-nibbles" in out and "Examples" in out


def test_float16_one_shard_no_hash_layers(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "h", format="mxfp4-dsv4", dtype_torch=torch.float16, shards=1,
                                      hash_layers=0, **{k: v for k, v in SMALL.items() if k != "shards"})
    t = load_all(root)
    assert [p.name for p in root.glob("model-*")] == ["model-00001-of-00001.safetensors"]
    assert t["embed.weight"].dtype == torch.float16 and "layers.0.ffn.gate.bias" in t
    assert not any(n.endswith("tid2eid") for n in t)
    w = expert_matrix(0, "0", 1, "gate", 64, 64, dtype=torch.float16)
    assert ((_dequant("mxfp4-dsv4", t, "0", 1, "gate") - w).norm() / w.norm()).item() < 0.2


@pytest.mark.parametrize("family", ["deepseek-v41", "qwen3-moe"])
def test_a_synth_killed_mid_write_is_replaced_by_the_next_forced_run(tmp_path, family):
    """A synth run killed by SIGKILL leaves OUT.partial holding its lock, its progress record and the files it had
    written (tokenizer and generation configs among them): the next `synth --force` knows the directory as its
    own run's (OutputTree(writes=...): the configs synth writes) and replaces it; a file no synth writes is
    still refused, never deleted."""
    from dsv4_convert.runtime.output import OutputTree

    ref = write_synthetic_checkpoint(tmp_path / "ref", family=family, **SMALL)
    out = tmp_path / "x"
    killed = OutputTree(out, resumable=False)
    killed.open("a synth run, killed")
    for f in ref.iterdir():  # everything a run writes, as a kill after the last file would leave it
        if f.name != "synth.json":
            shutil.copyfile(f, killed.path / f.name)
    killed._locks.release()  # SIGKILL: the lock goes with the process, the staging directory stays
    assert {"config.json", "model.safetensors.index.json"} <= {p.name for p in killed.path.iterdir()}
    write_synthetic_checkpoint(out, family=family, force=True, **SMALL)
    assert not killed.path.exists() and json.loads((out / "synth.json").read_text())["family"] == family
    foreign = OutputTree(tmp_path / "y", resumable=False)
    foreign.open("a synth run, killed")
    (foreign.path / "notes.txt").write_text("a user's file")
    foreign._locks.release()
    with pytest.raises(OutputError) as e:
        write_synthetic_checkpoint(tmp_path / "y", family=family, force=True, **SMALL)
    assert e.value.error_id == "paths.partial_not_ours" and (foreign.path / "notes.txt").exists()
