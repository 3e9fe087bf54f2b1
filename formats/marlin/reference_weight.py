"""The Marlin FP4 weight repack on numpy arrays (docs/spec/MARLIN_FP4.md §2): packed code bytes [N, K/2] <->
int32 words [K/16, 2N]. No torch: the converter's CPU path runs on this module alone (formats/marlin/weight.py
is the torch API over it).

Source element (k, n) of a W4A16 tile lands at
    row = k // 16,  col = 128*(n // 64) + 4*(4*(n % 8) + (k % 8) // 2) + (n % 64) // 16,
    nibble = 4*(k % 2) + 2*((n % 16) // 8) + (k % 16) // 8.

W4A16 is computed on 64-bit words (8 source bytes of one row, j = 8*kt + 4*h + q) as a few
bit-swaps plus one word transpose, so every pass is either a contiguous ufunc or a word copy.
Name the nibble address inside a word (a0 = k % 2, a1 a2 = q, a3 = h) and the row bits of
n % 64 = 16*t + 8*dn + r (t = 2*t1 + t0). Each step exchanges two address bits:
  1. a0 <-> a3 in-word (nibble swap with shift 28),
  2. a1 <-> dn and a2 <-> t0 across word pairs (byte swaps with shift 8 / 16 between rows n, n+8 / n+16),
  3. a2 <-> a3 in-word (byte swap with shift 16),
after which every word holds two finished output int32 and one word transpose
(c, t1, q1, q0, r, kt) -> (kt, c, r, q1, q0, t1) puts them in place. All swaps are their own
inverse, so from_marlin_weight runs the same steps backwards. Rows are processed in blocks of a
few 64-row tiles so the intermediates stay in L2; with more than one thread (the `threads` argument,
else torch's thread count, or the cores) the blocks are shared out to threads (numpy ufuncs and the
kernel release the GIL).
W4A8 (32x32 tiles) permutes 2-byte units and swaps nibbles inside each int32.
Leading (expert) dimensions are kept.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..constants import MARLIN_TILE_N
from . import compiled_kernels

__all__ = ["a16_forward", "a16_inverse", "a8_forward", "a8_inverse", "default_threads"]

_U64 = np.uint64
_BLOCK_BYTES = 1 << 19  # source bytes per block of 64-row tiles: two such buffers fit a 1 MiB L2
# (shift, mask) of each bit exchange, in forward order; see the module docstring
_NIBBLE_SWAP = (_U64(28), _U64(0x00000000_F0F0F0F0))  # a0 <-> a3
_DN_SWAP = (_U64(8), _U64(0x00FF00FF_00FF00FF))  # a1 <-> dn (rows n, n + 8)
_T0_SWAP = (_U64(16), _U64(0x0000FFFF_0000FFFF))  # a2 <-> t0 (rows n, n + 16)
_HALF_SWAP = (_U64(16), _U64(0x00000000_FFFF0000))  # a2 <-> a3
_TO_OUT = (5, 0, 4, 2, 3, 1)  # block (c, t1, t0, dn, r, kt) -> output (kt, c, r, q1, q0, t1)
_FROM_OUT = (1, 5, 3, 4, 2, 0)


def default_threads() -> int:
    """Threads a repack uses when its caller names none: torch's setting where torch is in use, else the
    cores. The converter names its own (its executor's threads_per_job): it sets torch to 1 thread (its many
    small ops only wake OpenMP threads that then spin) and keeps the repack's threads."""
    torch = sys.modules.get("torch")  # never imported here
    return torch.get_num_threads() if torch is not None else (os.cpu_count() or 1)


def _delta_swap(src: np.ndarray, dst: np.ndarray, t: np.ndarray, shift, mask) -> None:
    """dst = src with its bits under `mask` exchanged with those `shift` higher (src may be dst)."""
    np.right_shift(src, shift, out=t)
    np.bitwise_xor(t, src, out=t)
    np.bitwise_and(t, mask, out=t)
    np.bitwise_xor(src, t, out=dst)
    np.left_shift(t, shift, out=t)
    np.bitwise_xor(dst, t, out=dst)


def _cross_swap(lo: np.ndarray, hi: np.ndarray, t: np.ndarray, shift, mask) -> None:
    """Exchange the bits of `lo` under mask << shift with the bits of `hi` under mask, in place."""
    np.right_shift(lo, shift, out=t)
    np.bitwise_xor(t, hi, out=t)
    np.bitwise_and(t, mask, out=t)
    np.bitwise_xor(hi, t, out=hi)
    np.left_shift(t, shift, out=t)
    np.bitwise_xor(lo, t, out=lo)


def _row_pair_swaps(y: np.ndarray, t: np.ndarray) -> None:
    """Step 2 on a block y [m, t1, t0, dn, r, kt] (t: scratch like y); the two swaps commute."""
    _cross_swap(y[:, :, :, 0], y[:, :, :, 1], t[:, :, :, 0], *_DN_SWAP)
    _cross_swap(y[:, :, 0], y[:, :, 1], t[:, :, 0], *_T0_SWAP)


def _a16_blocks(src: np.ndarray, dst: np.ndarray, blocks: list[tuple[int, int]], tiles: int, forward: bool):
    """Run the W4A16 steps on the given (expert, first 64-row tile) blocks. Source words are
    [E, C, t1, t0, dn, r, kt], Marlin words [E, kt, C, r, q1, q0, t1] (u64 = two output int32)."""
    rows = src if forward else dst
    n_tiles, kt = rows.shape[1], rows.shape[-1]
    y = np.empty((tiles, 2, 2, 2, 8, kt), _U64)
    t = np.empty_like(y)
    for e, c0 in blocks:
        m = min(tiles, n_tiles - c0)
        yb, tb = y[:m], t[:m]
        if forward:
            _delta_swap(src[e, c0:c0 + m], yb, tb, *_NIBBLE_SWAP)
            _row_pair_swaps(yb, tb)
            _delta_swap(yb, yb, tb, *_HALF_SWAP)
            np.copyto(dst[e, :, c0:c0 + m], yb.transpose(_TO_OUT))
        else:
            np.copyto(yb, src[e, :, c0:c0 + m].transpose(_FROM_OUT))
            _delta_swap(yb, yb, tb, *_HALF_SWAP)
            _row_pair_swaps(yb, tb)
            _delta_swap(yb, dst[e, c0:c0 + m], tb, *_NIBBLE_SWAP)


def _a16_run(src: np.ndarray, dst: np.ndarray, k2: int, forward: bool, threads: int | None) -> None:
    n_experts, n_tiles = (src.shape[0], src.shape[1]) if forward else (src.shape[0], src.shape[2])
    tiles = max(1, min(n_tiles, _BLOCK_BYTES // (MARLIN_TILE_N * k2)))
    blocks = [(e, c0) for e in range(n_experts) for c0 in range(0, n_tiles, tiles)]
    threads = min(threads or default_threads(), len(blocks))
    if threads <= 1:
        _a16_blocks(src, dst, blocks, tiles, forward)
        return
    with ThreadPoolExecutor(threads) as pool:  # blocks write disjoint parts of dst
        jobs = [pool.submit(_a16_blocks, src, dst, blocks[i::threads], tiles, forward) for i in range(threads)]
        for job in jobs:
            job.result()


def _threaded_kernel(src: np.ndarray, out: np.ndarray, threads: int | None) -> None:
    """The kernel over ranges of 64-row tiles, on `threads` threads (it drops the GIL)."""
    n_tiles = src.shape[1]
    threads = min(threads or default_threads(), n_tiles)
    if threads <= 1 or src.nbytes < (8 << 20):
        compiled_kernels.repack_a16(src, out)
        return
    bounds = np.linspace(0, n_tiles, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(compiled_kernels.repack_a16, src[:, a:b], out[:, :, a:b]) for a, b in zip(bounds, bounds[1:])]
        for job in jobs:
            job.result()


def a16_forward(b: np.ndarray, n: int, k2: int, *, compiled: bool = True, threads: int | None = None) -> np.ndarray:
    """The compiled kernel (one pass, ~4x the numpy steps on one core) unless compiled=False: the
    numpy steps, kept as the reference the kernel is tested against. On `threads` threads (None:
    default_threads())."""
    src = b.reshape(-1, n // 64, 2, 2, 2, 8, k2).view(_U64)
    out = np.empty((src.shape[0], k2 // 8, n // 64, 8, 2, 2, 2), _U64)
    if compiled:
        _threaded_kernel(src, out, threads)
    else:
        _a16_run(src, out, k2, forward=True, threads=threads)
    return out.reshape(-1).view("<u4")


def a16_inverse(q: np.ndarray, n: int, k2: int, *, threads: int | None = None) -> np.ndarray:
    src = q.view(_U64).reshape(-1, k2 // 8, n // 64, 8, 2, 2, 2)
    out = np.empty((src.shape[0], n // 64, 2, 2, 2, 8, k2 // 8), _U64)
    _a16_run(src, out, k2, forward=False, threads=threads)
    return out.reshape(-1).view(np.uint8)


def _swap_bytes_1_2(w: np.ndarray) -> np.ndarray:
    return (w & 0xFF0000FF) | ((w & 0x0000FF00) << 8) | ((w & 0x00FF0000) >> 8)


def _swap_nibbles_1_2(w: np.ndarray) -> np.ndarray:
    """Swap nibbles 1 and 2 of each 16-bit half."""
    return (w & 0xF00FF00F) | ((w & 0x00F000F0) << 4) | ((w & 0x0F000F00) >> 4)


def a8_forward(b: np.ndarray, n: int, k2: int) -> np.ndarray:
    # source unit (c, gq, r, kt2, hb, q) holds bytes lb = 0, 1 of n = 32c+8gq+r, j = 16kt2+8hb+2q+lb
    units = b.view("<u2").reshape(-1, n // 32, 4, 8, k2 // 16, 2, 4)
    units = np.ascontiguousarray(units.transpose(0, 4, 1, 3, 6, 2, 5))  # -> (kt2, c, r, q, gq, hb)
    return _swap_nibbles_1_2(_swap_bytes_1_2(units.reshape(-1).view("<u4")))


def a8_inverse(q: np.ndarray, n: int, k2: int) -> np.ndarray:
    units = _swap_bytes_1_2(_swap_nibbles_1_2(q)).view("<u2").reshape(-1, k2 // 16, n // 32, 8, 4, 4, 2)
    return np.ascontiguousarray(units.transpose(0, 2, 5, 3, 1, 6, 4)).reshape(-1).view(np.uint8)
