"""core/targets/rescale.py: the one vLLM rescale routine the converter's planning pass and validate share.

A real synthetic NVFP4 checkpoint whose layer-0 block scales are shrunk (so vLLM's factor is > 1);
the expected factor per stack is vllm_rescale_factor over the scale tensors as safetensors'
own `load_file` reads them, grouped by hand from the tensor names. No substitutions.
"""

import re

import torch
from safetensors.torch import load_file, save_file

from dsv4_convert.core.checkpoint.reader import TensorReader, open_checkpoint
from dsv4_convert.core.targets.rescale import stack_rescale_factors
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin.scales import vllm_rescale_factor
from dsv4_convert.synth import write_synthetic_checkpoint


def _shrink_layer0_scales(root):
    for shard in sorted(root.glob("*.safetensors")):
        t = load_file(shard)
        for name in t:
            if re.fullmatch(r"layers\.0\.ffn\.experts\.\d+\.w\d\.weight_scale", name):
                t[name] = (t[name].float() / 64).to(torch.float8_e4m3fn)
        save_file(t, shard, metadata={"format": "pt"})


def test_factors_per_stack_match_the_codec_on_the_files(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "ckpt", layers=2, experts=4, hidden=128, intermediate=64, shards=2)
    _shrink_layer0_scales(root)
    scales = {}
    for shard in sorted(root.glob("*.safetensors")):
        for name, t in load_file(shard).items():
            m = re.fullmatch(r"(layers\.\d+\.ffn\.experts)\.\d+\.(w\d)\.weight_scale", name)
            if m:
                scales.setdefault(f"{m[1]}.{'w2' if m[2] == 'w2' else 'w13'}", []).append(t)
    expected = {k: vllm_rescale_factor(v, "bfloat16") for k, v in scales.items()}
    assert expected["layers.0.ffn.experts.w13"] > 1.0  # the shrunk layer really needs a factor
    ckpt = open_checkpoint(root)
    with TensorReader(root) as reader:
        got = stack_rescale_factors(reader, ckpt.projections, "bfloat16")
        assert got == expected
        assert set(stack_rescale_factors(reader, ckpt.projections, "float16").values()) == {1.0}


def test_only_vllm_with_bf16_rescales():
    assert MarlinTarget("vllm", "bfloat16").rescales
    assert not MarlinTarget("vllm", "float16").rescales and not MarlinTarget("sglang", "bfloat16").rescales
