"""Which GPU architectures a CUDA shared library carries code for: a pure reader of the CUDA
fatbinary in an ELF file's `.nv_fatbin` section (no cuobjdump, no CUDA needed).

ELF64 little-endian: the section headers give `.nv_fatbin`'s offset and size. The section holds one
or more fatbinary containers: a 16-byte header (magic 0xBA55ED50, u16 version 1, u16 header size,
u64 size of the entries that follow), then entries back to back, each with a header of its own:
u16 kind (1 = PTX, 2 = ELF: SASS machine code), u16, u32 header size, u64 payload size, ...,
u32 arch (e.g. 90 for sm_90) at byte 28; the next entry starts after header + payload.
Only headers are read: payloads (possibly compressed) are skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CudaCode", "FatbinError", "parse_fatbin", "read_cuda_code", "elf_section"]

FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)  # executable, relocatable
_KIND = {1: "ptx", 2: "sass"}


class FatbinError(ValueError):
    """The file is not an ELF with a readable fatbinary."""


@dataclass
class CudaCode:
    sass: set[int] = field(default_factory=set)  # architectures with machine code, e.g. {90}
    ptx: set[int] = field(default_factory=set)  # architectures with PTX (JIT-compiled by the driver)

    def runs_natively(self, major: int, minor: int) -> bool:
        """SASS for sm_XY runs on sm_XZ with Z >= Y (same major): the CUDA binary compatibility rule."""
        return any(a // 10 == major and a % 10 <= minor for a in self.sass)

    def ptx_for(self, major: int, minor: int) -> bool:
        return any(a <= 10 * major + minor for a in self.ptx)


def elf_section(path: str | Path, name: str) -> bytes | None:
    """The bytes of one section of an ELF64 little-endian file, or None when it has no such section."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF":
            raise FatbinError(f"{path} is not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise FatbinError(f"{path}: only 64-bit little-endian ELF is supported")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        if shoff == 0 or shnum == 0 or shentsize < 64:
            return None
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        if len(table) < shentsize * shnum or shstrndx >= shnum:
            raise FatbinError(f"{path}: truncated ELF section table")
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, str_off, str_size = sections[shstrndx]
        f.seek(str_off)
        names = f.read(str_size)
        want = name.encode()
        for sh_name, sh_type, _, _, off, size in sections:
            end = names.find(b"\0", sh_name)
            if names[sh_name:end] == want:
                if sh_type == 8:  # SHT_NOBITS: nothing in the file
                    return b""
                f.seek(off)
                data = f.read(size)
                if len(data) < size:
                    raise FatbinError(f"{path}: section {name} runs past the end of the file")
                return data
    return None


def parse_fatbin(data: bytes) -> list[tuple[str, int]]:
    """Every (kind, arch) entry of the fatbinary containers in `data` (kind 'ptx' / 'sass' / 'other')."""
    out, pos = [], 0
    while pos + 16 <= len(data):
        magic, version, hsize, size = struct.unpack_from("<IHHQ", data, pos)
        if magic not in FATBIN_MAGICS:
            if any(data[pos:]):
                raise FatbinError(f"no fatbinary header at offset {pos} (magic {magic:#x})")
            break  # zero padding at the end of the section
        if hsize < 16 or pos + hsize + size > len(data):
            raise FatbinError(f"fatbinary container at offset {pos} claims {size} bytes past the section end")
        entry, end = pos + hsize, pos + hsize + size
        while entry + 32 <= end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if ehsize < 32:
                raise FatbinError(f"fatbinary entry at offset {entry} has a header of {ehsize} bytes")
            out.append((_KIND.get(kind, "other"), arch))
            entry += ehsize + psize
        pos = (end + 7) & ~7 if end % 8 and not any(data[end:(end + 7) & ~7]) else end
    return out


def read_cuda_code(path: str | Path) -> CudaCode:
    """SASS and PTX architectures in a shared library's `.nv_fatbin` (empty when it has none)."""
    data = elf_section(path, ".nv_fatbin")
    code = CudaCode()
    for kind, arch in parse_fatbin(data or b""):
        if kind == "sass":
            code.sass.add(arch)
        elif kind == "ptx":
            code.ptx.add(arch)
    return code
