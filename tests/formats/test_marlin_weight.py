"""formats/marlin/weight.py against an independent reference written from the closed form of
docs/spec/MARLIN_FP4.md §2, plus round trips, threading, leading dims and bad input."""

import pytest
import torch

from dsv4_convert.formats.e2m1 import pack_nibbles, unpack_nibbles
from dsv4_convert.formats.marlin.weight import check_marlin_weight_shape, from_marlin_weight, to_marlin_weight
from tests.helpers.compare import assert_bytes_equal

DK = (0, 8, 0, 8, 1, 9, 1, 9)
DN = (0, 0, 8, 8, 0, 0, 8, 8)
DK8 = (0, 16, 1, 17, 2, 18, 3, 19)


def _as_int32(q: torch.Tensor) -> torch.Tensor:
    return (q & 0xFFFFFFFF).to(torch.uint32).view(torch.int32)


def _reference_w4a16(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] -> int32 [K/16, 2N]; the §2 sum over s, vectorised over (kt, c, lane, t)."""
    n, k = codes.shape
    kt, c, lane, t = torch.meshgrid(torch.arange(k // 16), torch.arange(n // 64), torch.arange(32),
                                    torch.arange(4), indexing="ij")
    q = torch.zeros(k // 16, 2 * n, dtype=torch.int64)
    acc = torch.zeros(kt.shape, dtype=torch.int64)
    for s in range(8):
        k_s = 16 * kt + 2 * (lane % 4) + DK[s]
        n_s = 64 * c + 16 * t + lane // 4 + DN[s]
        acc |= codes[n_s, k_s].long() << (4 * s)
    q[kt, 128 * c + 4 * lane + t] = acc
    return _as_int32(q)


def _reference_w4a16_scalar(codes: torch.Tensor) -> torch.Tensor:
    """The same formula as literal loops (only for the smallest shapes)."""
    n, k = codes.shape
    q = [[0] * (2 * n) for _ in range(k // 16)]
    for kt in range(k // 16):
        for c in range(n // 64):
            for lane in range(32):
                for t in range(4):
                    word = 0
                    for s in range(8):
                        k_s = 16 * kt + 2 * (lane % 4) + DK[s]
                        n_s = 64 * c + 16 * t + lane // 4 + DN[s]
                        word |= int(codes[n_s, k_s]) << (4 * s)
                    q[kt][128 * c + 4 * lane + t] = word
    return _as_int32(torch.tensor(q, dtype=torch.int64))


def _reference_w4a8(codes: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    kt2, c, lane, gq = torch.meshgrid(torch.arange(k // 32), torch.arange(n // 32), torch.arange(32),
                                      torch.arange(4), indexing="ij")
    acc = torch.zeros(kt2.shape, dtype=torch.int64)
    for s in range(8):
        k_s = 32 * kt2 + 4 * (lane % 4) + DK8[s]
        n_s = 32 * c + lane // 4 + 8 * gq
        acc |= codes[n_s, k_s].long() << (4 * s)
    f = 128 * c + 4 * lane + gq
    q = torch.zeros(k // 16, 2 * n, dtype=torch.int64)
    q[2 * kt2 + f // (2 * n), f % (2 * n)] = acc
    return _as_int32(q)


def _random_codes(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_smallest_tile_matches_the_literal_loops():
    codes = _random_codes(64, 16, 0)
    assert_bytes_equal(_reference_w4a16(codes), _reference_w4a16_scalar(codes), "reference self-check")
    assert_bytes_equal(to_marlin_weight(pack_nibbles(codes)), _reference_w4a16_scalar(codes))


def test_single_code_lands_where_the_forward_map_says():
    # code 0b0101 at (n, k) = (9, 3): row 0, col 4*(4*1 + 1) + 0 = 20, nibble 4*1 + 2*1 + 0 = 6
    codes = torch.zeros(64, 16, dtype=torch.uint8)
    codes[9, 3] = 0b0101
    q = to_marlin_weight(pack_nibbles(codes))
    assert torch.count_nonzero(q).item() == 1
    assert q[0, 20].item() == 0b0101 << 24


@pytest.mark.parametrize("n", [64, 128, 192])
@pytest.mark.parametrize("k", [16, 32, 48, 64, 128, 256])
def test_w4a16_matches_reference(n, k):
    codes = _random_codes(n, k, n * 1000 + k)
    assert_bytes_equal(to_marlin_weight(pack_nibbles(codes)), _reference_w4a16(codes), f"N={n} K={k}")


@pytest.mark.parametrize("n", [32, 64, 96, 192])
@pytest.mark.parametrize("k", [32, 64, 96, 256])
def test_w4a8_matches_reference(n, k):
    codes = _random_codes(n, k, n * 1000 + k + 1)
    assert_bytes_equal(to_marlin_weight(pack_nibbles(codes), w4a8=True), _reference_w4a8(codes), f"N={n} K={k}")


@pytest.mark.parametrize("w4a8", [False, True])
@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize("seed", range(3))
def test_roundtrip_with_and_without_expert_dims(w4a8, lead, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 64 * (1 + seed) + (0 if not w4a8 else 32)
    k = 32 * (1 + 2 * seed)
    packed = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, generator=gen)
    q = to_marlin_weight(packed, w4a8=w4a8)
    assert q.shape == (*lead, k // 16, 2 * n) and q.dtype == torch.int32
    assert_bytes_equal(from_marlin_weight(q, w4a8=w4a8), packed)
    if lead:  # a stack is its experts, repacked one by one
        flat = packed.reshape(-1, n, k // 2)
        each = torch.stack([to_marlin_weight(x, w4a8=w4a8) for x in flat])
        assert_bytes_equal(q.reshape(each.shape), each)


def test_large_shape_roundtrip_and_reference_on_a_corner():
    # several row blocks (the implementation works on blocks of 64-row tiles)
    codes = _random_codes(1024, 2048, 7)
    packed = pack_nibbles(codes)
    q = to_marlin_weight(packed)
    assert_bytes_equal(q[:2, :256], _reference_w4a16(codes[:128, :32]))
    assert_bytes_equal(q[-2:, -256:], _reference_w4a16(codes[-128:, -32:]))
    assert_bytes_equal(from_marlin_weight(q), packed)


@pytest.mark.parametrize("w4a8", [False, True])
def test_thread_count_does_not_change_bytes(w4a8):
    packed = torch.randint(0, 256, (3, 256, 512), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    one = to_marlin_weight(packed, w4a8=w4a8, threads=1)
    two = to_marlin_weight(packed, w4a8=w4a8, threads=2)
    assert_bytes_equal(from_marlin_weight(two, w4a8=w4a8, threads=2), packed)
    assert_bytes_equal(from_marlin_weight(two, w4a8=w4a8, threads=1), packed)
    assert_bytes_equal(two, one)


def test_int8_and_non_contiguous_inputs():
    packed = torch.randint(0, 256, (128, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    expected = to_marlin_weight(packed)
    assert_bytes_equal(to_marlin_weight(packed.view(torch.int8)), expected)
    assert_bytes_equal(to_marlin_weight(packed.T.contiguous().T), expected)
    assert_bytes_equal(from_marlin_weight(expected.T.contiguous().T), packed)


def test_inverse_gives_uint8_codes_that_unpack():
    codes = _random_codes(64, 32, 5)
    assert_bytes_equal(unpack_nibbles(from_marlin_weight(to_marlin_weight(pack_nibbles(codes)))), codes)


def test_empty_inputs():
    assert to_marlin_weight(torch.empty(0, 64, 8, dtype=torch.uint8)).shape == (0, 1, 128)
    assert from_marlin_weight(torch.empty(2, 0, 128, dtype=torch.int32)).shape == (2, 64, 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: to_marlin_weight(torch.zeros(64, 8)), "uint8 or int8, got torch.float32"),
        (lambda: to_marlin_weight(torch.zeros(64, 8, dtype=torch.int32)), "uint8 or int8"),
        (lambda: to_marlin_weight(torch.zeros(64, dtype=torch.uint8)), r"\[\.\.\., N, K/2\]"),
        (lambda: to_marlin_weight(torch.zeros(64, 2, dtype=torch.uint8)), "K=4 must be a multiple of 8"),
        (lambda: to_marlin_weight(torch.zeros(64, 4, dtype=torch.uint8)), r"N=64, K=8 .* \(16 in K, 64 in N\)"),
        (lambda: to_marlin_weight(torch.zeros(96, 8, dtype=torch.uint8)), r"N=96, K=16 .*pad it first"),
        (lambda: to_marlin_weight(torch.zeros(64, 8, dtype=torch.uint8), w4a8=True), r"\(32 in K, 32 in N\)"),
        (lambda: to_marlin_weight(torch.zeros(48, 16, dtype=torch.uint8), w4a8=True), "N=48"),
        (lambda: from_marlin_weight(torch.zeros(1, 128, dtype=torch.uint8)), "int32, got torch.uint8"),
        (lambda: from_marlin_weight(torch.zeros(1, 127, dtype=torch.int32)), "even last dimension"),
        (lambda: from_marlin_weight(torch.zeros(1, 96, dtype=torch.int32)), "N=48"),
        (lambda: from_marlin_weight(torch.zeros(1, 128, dtype=torch.int32), w4a8=True), "K=16"),
        (lambda: check_marlin_weight_shape(64, 12), "K=12 must be a multiple of 8"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
