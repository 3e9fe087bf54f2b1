"""The integrity hash: one home for the algorithm that staging, the manifest and every verifier use.
Records name their algorithm (`HASH_ALGORITHM`), and verifiers read it back from the record, so the
choice can change without making older outputs unverifiable."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["HASH_ALGORITHM", "new_hash", "file_digest"]

HASH_ALGORITHM = "sha256"
_CHUNK = 16 << 20


def new_hash(algorithm: str = HASH_ALGORITHM):
    """A streaming hasher (`update(bytes)`, `hexdigest()`) for `algorithm`."""
    return hashlib.new(algorithm)


def file_digest(path: Path, algorithm: str = HASH_ALGORITHM) -> str:
    h = new_hash(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
