"""Compiled (numba) inner loops of the converter, where numpy would need several passes over memory.

Each kernel does in one pass what the numpy reference in reference_weight (`a16_forward(compiled=False)`)
or scales does in many; tests compare both byte for byte. Compiled once per machine and
cached (numba's `cache=True`: beside this file, else in the user's cache folder), so a later start
costs an import, not a compile. A user who can write neither (a read-only install and no writable
$HOME: a service account, a container's non-root user) gets a private folder of their own under the
temporary directory, else compiles in every process: never numba's "no locator available" at import.
  repack_a16      W4A16 weight repack (the bit exchanges of reference_weight, per group of 4 words
                  held in registers, written straight to their final place)
  permute_scales  [N, G] -> Marlin [G, N] with the 64-column permutation (transpose + perm in one),
                  optionally through a 256-entry byte table on the way (NVFP4 -> S0E5M3 in the same pass)
  byte_presence   which of the 256 byte values occur (NaN / lost-scale checks without a mask tensor)
  lookup          a 256-entry byte table applied in place
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile

import numba as nb
import numpy as np


def _load_numba_arraymath_without_scipy() -> None:
    """numba's first kernel load imports numba.np.arraymath, whose `_check_blas` imports scipy.linalg only to
    learn whether np.dot may be compiled: 0.29 s of a 1.04 s warm small conversion on the 16-core box, where
    scipy is installed (cProfile, docs/PERFORMANCE.md). These kernels use no BLAS, and the converter runs no
    other numba code: numba loads here with that probe answered "no" (scipy itself stays importable)."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg.cython_blas" in sys.modules:
        return
    sys.modules["scipy.linalg.cython_blas"] = None  # an import of it raises ImportError: numba's "no BLAS"
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules["scipy.linalg.cython_blas"]


_load_numba_arraymath_without_scipy()

__all__ = ["repack_a16", "permute_scales", "byte_presence", "lookup"]

_OPTIONS = dict(nogil=True, boundscheck=False)


def _private_cache_dir() -> str | None:
    """TMPDIR/dsv4-convert-numba-UID, made 0700 and checked to be this user's own real folder that no
    one else can write (a cache file is code this process would load), or None."""
    path = os.path.join(tempfile.gettempdir(), f"dsv4-convert-numba-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


def _jit(fn):
    """numba.njit with the compiled code cached where this user can write one (see the module doc)."""
    try:
        return nb.njit(cache=True, **_OPTIONS)(fn)
    except RuntimeError as e:  # numba found no folder it may write ("no locator available")
        if "no locator" not in str(e):
            raise
    saved, nb.config.CACHE_DIR = nb.config.CACHE_DIR, _private_cache_dir()
    try:
        if nb.config.CACHE_DIR:
            return nb.njit(cache=True, **_OPTIONS)(fn)
    except RuntimeError:
        pass
    finally:
        nb.config.CACHE_DIR = saved  # numba's setting, as found, for any other user of numba in this process
    return nb.njit(**_OPTIONS)(fn)


@_jit
def _swap(x, shift, mask):
    t = ((x >> shift) ^ x) & mask
    return x ^ t ^ (t << shift)


@_jit
def _exchange(hi, lo, shift, mask):
    """Delta swap between two words: the `mask` bits of `lo` trade places with those of `hi >> shift`
    (numba inlines it; the tuple costs nothing)."""
    t = ((hi >> shift) ^ lo) & mask
    return hi ^ (t << shift), lo ^ t


@_jit
def repack_a16(src, out):
    """src: u64 words [E, C, t1, t0, dn, r, kt] (8 packed bytes of one row each); out: u64 words
    [E, kt, C, r, t0, dn, t1] (two output int32 each). Steps as in reference_weight' docstring."""
    n_e, n_c, n_kt = src.shape[0], src.shape[1], src.shape[6]
    s28, s16, s8 = np.uint64(28), np.uint64(16), np.uint64(8)
    m_nib, m_half = np.uint64(0x00000000F0F0F0F0), np.uint64(0x00000000FFFF0000)
    m_dn, m_t0 = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF)
    for e in range(n_e):
        for c in range(n_c):
            for kt in range(n_kt):
                for r in range(8):
                    for t1 in range(2):
                        a = _swap(src[e, c, t1, 0, 0, r, kt], s28, m_nib)  # (t0, dn) = (0, 0)
                        b = _swap(src[e, c, t1, 0, 1, r, kt], s28, m_nib)  # (0, 1)
                        cc = _swap(src[e, c, t1, 1, 0, r, kt], s28, m_nib)  # (1, 0)
                        d = _swap(src[e, c, t1, 1, 1, r, kt], s28, m_nib)  # (1, 1)
                        a, b = _exchange(a, b, s8, m_dn)  # a1 <-> dn between rows n, n + 8
                        cc, d = _exchange(cc, d, s8, m_dn)
                        a, cc = _exchange(a, cc, s16, m_t0)  # a2 <-> t0 between rows n, n + 16
                        b, d = _exchange(b, d, s16, m_t0)
                        out[e, kt, c, r, 0, 0, t1] = _swap(a, s16, m_half)
                        out[e, kt, c, r, 0, 1, t1] = _swap(b, s16, m_half)
                        out[e, kt, c, r, 1, 0, t1] = _swap(cc, s16, m_half)
                        out[e, kt, c, r, 1, 1, t1] = _swap(d, s16, m_half)


@_jit
def permute_scales(src, perm, table, out):
    """src [B, N, G] bytes, perm [P] (source column in each block of P), table [256] bytes or empty
    (no table), out [B, G, N]: out[b, g, P*j + q] = table[src[b, P*j + perm[q], g]]."""
    n_b, n, g = src.shape
    p = perm.shape[0]
    lut = table.shape[0] == 256  # loop-invariant: the compiler unswitches the loop on it
    for b in range(n_b):
        for j in range(n // p):
            for gi in range(g):
                for q in range(p):
                    v = src[b, p * j + perm[q], gi]
                    out[b, gi, p * j + q] = table[v] if lut else v


@_jit
def byte_presence(flat):
    seen = np.zeros(256, np.bool_)
    for i in range(flat.shape[0]):
        seen[flat[i]] = True
    return seen


@_jit
def lookup(flat, table):
    for i in range(flat.shape[0]):
        flat[i] = table[flat[i]]
