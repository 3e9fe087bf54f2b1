"""The one dtype table: every safetensors dtype string dsv4-convert knows, its size and its torch dtype,
and which of them an FP4 projection's tensors may have. Pure (no torch import: core/checkpoint/tensor_io.py turns
the torch names into dtypes for the callers that have torch loaded)."""

from __future__ import annotations

__all__ = ["ACT_DTYPE_NAMES", "DTYPE_SIZES", "DTYPES", "FP8_DTYPES", "SCALE_DTYPES", "SUB_BYTE_BITS", "WEIGHT_DTYPES"]

# safetensors dtype string -> (bytes per element, torch dtype name)
DTYPES = {
    "BOOL": (1, "bool"), "U8": (1, "uint8"), "I8": (1, "int8"),
    "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2"), "F8_E8M0": (1, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": (1, "float8_e4m3fnuz"), "F8_E5M2FNUZ": (1, "float8_e5m2fnuz"),
    "I16": (2, "int16"), "U16": (2, "uint16"), "F16": (2, "float16"), "BF16": (2, "bfloat16"),
    "I32": (4, "int32"), "U32": (4, "uint32"), "F32": (4, "float32"),
    "I64": (8, "int64"), "U64": (8, "uint64"), "F64": (8, "float64"), "C64": (8, "complex64"),
}
DTYPE_SIZES = {name: size for name, (size, _) in DTYPES.items()}
FP8_DTYPES = frozenset(name for name in DTYPES if name.startswith("F8_"))
ACT_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16"}  # activation dtype (torch name) -> safetensors name
# Sub-byte dtypes: only ever handled as packed bytes (dsv4-convert never writes them)
SUB_BYTE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}

# The one table of an FP4 projection's source tensor dtypes (grouping and detection decide with it, the
# converter routes by it, validate checks by it; /work/shared/spec CHECKPOINT_FORMATS.md has the producers):
# packed E2M1 weights are bytes of two codes (DeepSeek writes I8, every other producer U8); block scales,
# by Quant value, are NVFP4 F8_E4M3 (ModelOpt, compressed-tensors) and MXFP4 F8_E8M0 or its raw bits as U8
# (compressed-tensors, gpt-oss), so a U8 scale is always MXFP4. safetensors' own F4 dtype (one code per
# element) is not read as FP4: no known producer writes it, and no route here decodes it.
WEIGHT_DTYPES = ("U8", "I8")
SCALE_DTYPES = {"nvfp4": ("F8_E4M3",), "mxfp4": ("F8_E8M0", "U8")}
