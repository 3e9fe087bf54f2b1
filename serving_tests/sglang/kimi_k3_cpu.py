"""What SGLang's Kimi-K3 model (srt/models/kimi_k3.py) needs to be built, loaded and processed on a CPU; the same in
the source's model and the conversion's, never a compared tensor (serving_tests/sglang/harness_differential.py
applies it):
- `torch.cuda.Stream` / `torch.cuda.Event` -> a placeholder object: KimiK3LinearModel makes three auxiliary CUDA streams
  (`alt_streams`, overlap of its layers' side work in a forward pass): scheduling only, no tensor.
"""

from __future__ import annotations

__all__ = ["use_cpu_kimi_k3"]


class _NoStream:
    """What the model keeps of a CUDA stream or event here: nothing (they are used only in a forward pass)."""

    def __init__(self, *args, **kwargs):
        pass


def use_cpu_kimi_k3() -> None:
    import torch

    torch.cuda.Stream = torch.cuda.Event = _NoStream
