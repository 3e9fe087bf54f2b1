"""core/checkpoint/dtypes.py, the one dtype table: every safetensors dtype it names maps to a torch dtype of the
size it claims (torch's own itemsize is the independent reference), and the names are the ones the
safetensors format defines (the Rust crate's Dtype enum, written out here)."""

import torch

from dsv4_convert.core.checkpoint.dtypes import DTYPE_SIZES, DTYPES, FP8_DTYPES, SCALE_DTYPES, WEIGHT_DTYPES
from dsv4_convert.core.checkpoint.tensor_io import TORCH_DTYPES, safetensors_dtype

SAFETENSORS_NAMES = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
                     "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"}


def test_every_dtype_has_its_torch_dtype_of_the_same_size():
    assert set(DTYPES) == set(TORCH_DTYPES) == set(DTYPE_SIZES) == SAFETENSORS_NAMES
    for name, t in TORCH_DTYPES.items():
        assert torch.empty(0, dtype=t).element_size() == DTYPE_SIZES[name], name
        assert safetensors_dtype(torch.empty(0, dtype=t)) == name


def test_fp4_source_dtypes_are_one_byte_types_of_the_table():
    assert FP8_DTYPES == {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}
    for name in (*WEIGHT_DTYPES, *SCALE_DTYPES["nvfp4"], *SCALE_DTYPES["mxfp4"]):
        assert DTYPE_SIZES[name] == 1
