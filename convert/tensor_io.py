"""Reading tensor bytes with pread: no memory map, so a long conversion's RSS stays at the few
tensors in flight instead of growing with every page of the input it has touched."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .errors import InputError
from .tensor_model import TensorRef

__all__ = ["TORCH_DTYPES", "safetensors_dtype", "PreadReader"]

TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu, "I16": torch.int16, "U16": torch.uint16,
    "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32,
    "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64,
}
_BY_TORCH = {v: k for k, v in TORCH_DTYPES.items()}
CHUNK = 16 << 20


def safetensors_dtype(t: torch.Tensor) -> str:
    return _BY_TORCH[t.dtype]


class PreadReader:
    """Duck-compatible with the reader's TensorReader (`get`, `read_bytes`), without mmap."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._fds: dict[str, int] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, file: str) -> int:
        if file not in self._fds:
            self._fds[file] = os.open(self.root / file, os.O_RDONLY)
        return self._fds[file]

    def iter_bytes(self, ref: TensorRef, chunk: int = CHUNK):
        """Yield the tensor's bytes in chunks (for copying large passthrough tensors)."""
        fd, pos = self._fd(ref.file), ref.begin
        while pos < ref.end:
            data = os.pread(fd, min(chunk, ref.end - pos), pos)
            if not data:
                raise InputError(f"file ends at byte {pos}, but {ref.name} needs bytes up to {ref.end}",
                                 error_id="shard.truncated", tensor=ref.name, file=ref.file,
                                 hint="the shard is truncated: download it again")
            pos += len(data)
            yield data

    def read_bytes(self, ref: TensorRef) -> bytes:
        return b"".join(self.iter_bytes(ref))

    def get_expert(self, ref: TensorRef, index: int) -> torch.Tensor:
        """Slab `index` of a tensor stacked along dim 0 (gpt-oss experts), reading only its bytes."""
        slab = ref.nbytes // ref.shape[0]
        part = TensorRef(ref.name, ref.file, ref.dtype, tuple(ref.shape[1:]), ref.begin + index * slab,
                         ref.begin + (index + 1) * slab)
        return self.get(part)

    def get(self, ref: TensorRef) -> torch.Tensor:
        buf = bytearray(ref.nbytes)
        view, pos = memoryview(buf), 0
        for data in self.iter_bytes(ref):
            view[pos:pos + len(data)] = data
            pos += len(data)
        flat = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8)) if buf else torch.empty(0, dtype=torch.uint8)
        return flat.view(TORCH_DTYPES[ref.dtype]).reshape(ref.shape)
