"""formats/marlin/compiled_kernels.py (numba) against the numpy / torch reference paths it replaces, byte for
byte, on random bytes: the weight repack (one and several threads), the scale transpose +
permutation, the byte-presence and table-lookup helpers; and runtime/digest.py for both algorithms.
No substitutions: the references are the project's own earlier implementations and hashlib/xxhash."""

import hashlib

import numpy as np
import pytest
import torch
import xxhash

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.formats.marlin import compiled_kernels as fp4_kernels
from dsv4_convert.formats.marlin.reference_weight import a16_forward as _a16_forward
from dsv4_convert.formats.marlin.scales import (
    _apply_block_perm,
    nvfp4_scales_to_marlin,
    nvfp4_scales_to_s0e5m3,
    permute_scale_columns,
    scale_column_perm,
)
from dsv4_convert.formats.marlin.weight import to_marlin_weight
from dsv4_convert.runtime.digest import file_digest, new_hash


@pytest.mark.parametrize("e, n, k2", [(1, 64, 8), (3, 128, 64), (2, 256, 1024)])
def test_repack_kernel_matches_numpy_steps(e, n, k2):
    b = np.random.default_rng(e * n + k2).integers(0, 256, size=e * n * k2, dtype=np.uint8)
    assert np.array_equal(_a16_forward(b, n, k2), _a16_forward(b, n, k2, compiled=False))


def test_repack_threads_give_the_same_bytes():
    packed = torch.randint(0, 256, (2, 2048, 1024), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(to_marlin_weight(packed, threads=1), to_marlin_weight(packed, threads=2))


@pytest.mark.parametrize("shape", [(64, 4), (2, 256, 128), (4096, 256)])
def test_scale_permutation_kernel_matches_indexing(shape):
    s = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    fast = permute_scale_columns(s.transpose(-1, -2))  # the transposed view takes the kernel
    ref = _apply_block_perm(s.transpose(-1, -2).contiguous(), scale_column_perm(w4a8=False))
    assert torch.equal(fast, ref)


@pytest.mark.parametrize("engine, sf", [("sglang", 1.0), ("vllm", 1.0), ("vllm", 0.25)])
@pytest.mark.parametrize("shape", [(64, 8), (3, 128, 16), (2048, 256)])
def test_fused_nvfp4_scales_match_the_two_steps(engine, sf, shape):
    """The one-pass table + transpose + permutation against the value rule and the permutation
    applied one after the other (and the strided fallback, for a non-contiguous source)."""
    s = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    e4m3 = s.view(torch.float8_e4m3fn)
    ref = _apply_block_perm(nvfp4_scales_to_s0e5m3(e4m3, clamp=ENGINES[engine].scale_clamp, sf=sf).transpose(-1, -2).contiguous(),
                            scale_column_perm(w4a8=False))
    assert torch.equal(nvfp4_scales_to_marlin(e4m3, clamp=ENGINES[engine].scale_clamp, sf=sf), ref.view(torch.uint8))
    wide = torch.cat([s, s], dim=-1)[..., : s.shape[-1]].view(torch.float8_e4m3fn)  # strided rows
    assert torch.equal(nvfp4_scales_to_marlin(wide, clamp=ENGINES[engine].scale_clamp, sf=sf), ref.view(torch.uint8))


def test_byte_presence_and_lookup():
    flat = np.random.default_rng(3).integers(0, 200, size=10_000, dtype=np.uint8)
    seen = fp4_kernels.byte_presence(flat)
    assert np.array_equal(np.nonzero(seen)[0], np.unique(flat))
    table = np.random.default_rng(4).integers(0, 256, size=256, dtype=np.uint8)
    out = flat.copy()
    fp4_kernels.lookup(out, table)
    assert np.array_equal(out, table[flat])


def test_file_digest_both_algorithms(tmp_path):
    f = tmp_path / "blob"
    data = np.random.default_rng(5).integers(0, 256, size=(17 << 20) + 3, dtype=np.uint8).tobytes()
    f.write_bytes(data)
    assert file_digest(f, "sha256") == hashlib.sha256(data).hexdigest()
    assert file_digest(f, "xxh3_128") == xxhash.xxh3_128(data).hexdigest()
    assert file_digest(f) == xxhash.xxh3_128(data).hexdigest()
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        new_hash("md5")


def test_loading_the_kernels_does_not_import_scipy(tmp_path):
    """numba's BLAS probe would import scipy.linalg (0.3 s of a small conversion on the GPU box): a made-up
    `scipy` package whose linalg records its import stands in for an installed one; loading and running the
    kernels must not import scipy.linalg."""
    import subprocess
    import sys
    pkg = tmp_path / "scipy" / "linalg"
    pkg.mkdir(parents=True)
    (tmp_path / "scipy" / "__init__.py").write_text("__version__ = '1.16.0'\n")  # numba reads it at import
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    (pkg / "cython_blas.py").write_text("")
    code = ("from dsv4_convert.convert.cpu_path import load_kernels; load_kernels(); "
            "import numba.np.arraymath as a; print(a._HAVE_BLAS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert out.stdout.strip() == "False" and not (tmp_path / "imported").exists()
