"""The one table of numeric facts the codecs share. Everything else derives from these."""

__all__ = [
    "E2M1_VALUES", "E2M1_MAX", "E4M3_MAX", "E4M3_NAN_BITS", "E4M3_NAN_BYTES", "E8M0_BIAS", "E8M0_NAN", "NVFP4_GROUP", "MXFP4_GROUP",
    "MARLIN_TILE_K", "MARLIN_TILE_N", "W4A8_TILE", "W4A8_E8M0_OFFSET", "W4A8_MAX_SOURCE_BYTE",
    "S0E5M3_MULTIPLIER", "S0E5M3_MIN", "VLLM_RESCALE_TARGET", "ACT_EXPONENT_BIAS",
]

# E2M1 code -> value; bit 3 is the sign, so codes 8..15 mirror 0..7 (8 is -0.0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN_BITS = 0x7F  # e4m3fn NaN is S.1111.111; it has no infinity
E4M3_NAN_BYTES = (E4M3_NAN_BITS, 0x80 | E4M3_NAN_BITS)  # 0x7F and 0xFF
E8M0_BIAS = 127  # byte e means 2**(e - 127)
E8M0_NAN = 0xFF

NVFP4_GROUP = 16  # elements per E4M3 block scale along K
MXFP4_GROUP = 32  # elements per E8M0 block scale along K

MARLIN_TILE_K = 16  # W4A16 tile: 16 (k) x 64 (n)
MARLIN_TILE_N = 64
W4A8_TILE = 32  # W4A8 tile: 32 (k) x 32 (n)
W4A8_E8M0_OFFSET = 6  # FP4 -> E4M3 exponent-bias difference (2**3 - 2**1) folded into W4A8 scales
W4A8_MAX_SOURCE_BYTE = 248  # 249 + 6 = 255 decodes to Inf in the kernel

S0E5M3_MULTIPLIER = 128.0  # NVFP4 block scales are stored x 2**7 so the top bit is set (spec §3.3)
S0E5M3_MIN = 2.0  # vLLM >= 0.20 zeroes processed values below this (the bf16 decode needs byte >= 0x80)
VLLM_RESCALE_TARGET = E4M3_MAX * S0E5M3_MULTIPLIER  # 57344: vLLM lifts the max scale up to this

# Exponent bias the Marlin kernel leaves out when it expands FP4 codes: 2**(e-1) - 2**(2-1)
# for e = 5 (fp16) or 8 (bf16) exponent bits; the global scale carries 2**(B - 7) instead.
ACT_EXPONENT_BIAS = {"float16": 14, "bfloat16": 126}
