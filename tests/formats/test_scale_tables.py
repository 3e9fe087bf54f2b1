"""formats/marlin/reference_scales.py (numpy, no torch) against torch's own float8 / float16 / bfloat16
arithmetic, exhaustively over the 256 E4M3 bytes: the E4M3 decode, each target's S0E5M3 byte for
every rescale factor vLLM can pick (2**0 .. 2**17), the bytes that can be lost (a superset of what the
torch reverse loses, equal to it except where torch's saturating float -> E4M3 conversion happens to
give 448 back), vLLM's rescale factor, and the processed global on random and edge values.
No substitutions: the references are computed here with torch's dtypes."""

import math

import numpy as np
import pytest
import torch

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.formats.constants import ACT_EXPONENT_BIAS
from dsv4_convert.formats.marlin import reference_scales as st

CODES = torch.arange(256, dtype=torch.uint8)
NAN = np.isin(np.arange(256), [0x7F, 0xFF])
VLLM_FACTORS = [2.0 ** k for k in range(18)]


def _torch_s0e5m3(engine: str, sf: float) -> np.ndarray:
    v = CODES.view(torch.float8_e4m3fn).to(torch.float16)
    if engine == "vllm":
        v = (v.float() * sf).to(torch.float16) * 128.0
        v = torch.where(v < 2.0, torch.zeros_like(v), v)
    else:
        v = v * 128.0
    return ((v.view(torch.int16).to(torch.int32) & 0x7FFF) >> 7).to(torch.uint8).numpy()


def _torch_lost(engine: str, sf: float) -> np.ndarray:
    half = (torch.from_numpy(_torch_s0e5m3(engine, sf)).to(torch.int32) << 7).to(torch.int16).view(torch.float16)
    back = (half.float() / (128.0 * sf)).to(torch.float8_e4m3fn).view(torch.uint8)
    return (back != CODES).numpy()


def test_e4m3_decode():
    ref = CODES.view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(st.E4M3_VALUES, ref, equal_nan=True)
    assert np.array_equal(np.signbit(st.E4M3_VALUES[~NAN]), np.signbit(ref[~NAN]))


@pytest.mark.parametrize("engine, sf", [("sglang", 1.0)] + [("vllm", f) for f in VLLM_FACTORS])
def test_s0e5m3_table_and_inexact_bytes(engine, sf):
    assert np.array_equal(st.s0e5m3_table(clamp=ENGINES[engine].scale_clamp, sf=sf), _torch_s0e5m3(engine, sf))
    lost, inexact = _torch_lost(engine, sf), st.inexact_bytes(clamp=ENGINES[engine].scale_clamp, sf=sf)
    assert not (lost & ~inexact & ~NAN).any(), "every byte the reverse loses is flagged"
    extra = np.nonzero(inexact & ~lost & ~NAN)[0]
    # the only extra: 448 pushed past the half range; torch saturates inf back to 448 on the way back
    assert set(extra) <= {0x7E}, extra
    if sf == 1.0:
        assert not inexact[[0x00, 0x38, 0x40]].any(), "0, 1 and 2 survive"
        assert inexact[[0x80, 0xB8]].all(), "negatives do not"


def test_rescale_factor_matches_the_definition():
    rng = np.random.default_rng(0)
    vals = CODES.view(torch.float8_e4m3fn).to(torch.float16) * 128.0
    for _ in range(500):
        present = rng.random(256) < rng.choice([0.01, 0.05, 0.3])
        v = vals[torch.from_numpy(present) & (vals != 0)]
        m = v.max().item() if v.numel() else -math.inf
        ref = 1.0 if torch.isnan(v).any() or not (0 < m < 57344) else 2.0 ** math.floor(math.log2(57344 / m))
        assert st.rescale_factor(present, "bfloat16") == ref
        assert st.rescale_factor(present, "float16") == 1.0


def _torch_global(g: torch.Tensor, engine: str, act: str, sf: float) -> np.ndarray:
    factor = 2.0 ** (ACT_EXPONENT_BIAS[act] - 7)
    if engine == "vllm":
        return (g.float() * factor / sf).numpy()
    out = g.to(getattr(torch, act)) * factor
    return out.view(torch.int16).numpy().view(np.uint16) if act == "bfloat16" else out.numpy()


@pytest.mark.parametrize("engine, act, sf", [("vllm", "bfloat16", 1.0), ("vllm", "bfloat16", 2.0 ** 17),
                                             ("vllm", "float16", 1.0), ("sglang", "bfloat16", 1.0),
                                             ("sglang", "float16", 1.0)])
def test_processed_global(engine, act, sf):
    rng = np.random.default_rng(1)
    g = (rng.random(4000) * 10.0 ** rng.integers(-44, 12, 4000)).astype(np.float32)
    g = np.concatenate([g, np.float32([1e-45, 1.17e-38, 2.0 ** -126, 1 / 448, 6.0, 448.0, 65504.0, 7e4, 3e38])])
    g = g[g > 0]
    ours = st.global_to_marlin(g, fp32_global=ENGINES[engine].fp32_global, act_dtype=act, sf=sf)
    ref = _torch_global(torch.from_numpy(g), engine, act, sf)
    assert ours.dtype == ref.dtype and ours.tobytes() == ref.tobytes()
