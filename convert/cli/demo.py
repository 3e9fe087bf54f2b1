"""`dsv4-convert demo`: repack one random expert and check it round-trips (a codec smoke test)."""

import click
import torch

from ..formats.marlin import MarlinTarget, marlin_to_nvfp4, nvfp4_to_marlin
from ..formats.nvfp4 import quantize_nvfp4

__all__ = ["demo"]


@click.command(help="Quantize a random expert to NVFP4, repack it for Marlin, and verify the inverse.")
@click.option("--n", default=2048, show_default=True, help="output features")
@click.option("--k", default=4096, show_default=True, help="input features")
@click.option("--target", type=click.Choice(["sglang", "vllm"]), default="sglang", show_default=True)
def demo(n, k, target):
    torch.manual_seed(0)
    packed, scale, g = quantize_nvfp4(torch.randn(n, k))
    tgt = MarlinTarget(engine=target)
    q, s = nvfp4_to_marlin(packed, scale, target=tgt)
    back, back_scale = marlin_to_nvfp4(q, s, target=tgt, n=n, k=k)
    ok = torch.equal(back, packed) and torch.equal(back_scale.view(torch.uint8), scale.view(torch.uint8))
    click.echo(f"expert [{n}x{k}] -> marlin {tuple(q.shape)} int32 + scales {tuple(s.shape)} ({tgt.layout_tag}); "
               f"round trip {'byte-identical' if ok else 'MISMATCH'}")
    raise SystemExit(0 if ok else 1)
