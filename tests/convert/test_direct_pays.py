"""Where the converter writes whole shards with O_DIRECT (convert/safetensors_writer.py `direct_pays`):
not on tmpfs, which accepts O_DIRECT but copies into its page cache anyway. The filesystem type is
checked against an independent reading (the kernel's /proc/self/mountinfo), and a conversion into
tmpfs (the buffered path) gives the same bytes as one into tmp_path (O_DIRECT where it is taken).

Substitutions: none; the tmpfs cases are skipped where /dev/shm is not a writable tmpfs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec, direct_pays
from tests.helpers.cli import run_cli, tree_hashes

SHM = Path("/dev/shm")
MANIFEST = "dsv4-convert.manifest.json"


def _fs_type(path: Path) -> str:
    """The type of the mount holding `path`: the longest mount point that is a prefix of it."""
    real, best = os.path.realpath(path), ("", "")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount = fields[4].encode().decode("unicode_escape")  # \040 for a space
        fstype = fields[fields.index("-") + 1]
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
            best = (mount, fstype)
    return best[1]


def _shm_tmpfs() -> bool:
    return SHM.is_dir() and os.access(SHM, os.W_OK) and _fs_type(SHM) == "tmpfs"


@pytest.mark.parametrize("where", ["tmp", "shm", "root"])
def test_direct_pays_everywhere_but_tmpfs(where, tmp_path):
    path = {"tmp": tmp_path, "shm": SHM, "root": Path("/")}[where]
    if not path.is_dir():
        pytest.skip(f"no {path} here")
    assert direct_pays(path) is (_fs_type(path) != "tmpfs"), (path, _fs_type(path))


def test_a_missing_folder_counts_as_a_disk(tmp_path):
    assert direct_pays(tmp_path / "absent")


def test_direct_false_writes_through_the_page_cache(tmp_path):
    spec = [TensorSpec("x", "U8", (5 << 20,))]
    data = os.urandom(5 << 20)
    for name, direct in (("a", True), ("b", False)):
        w = ShardWriter(tmp_path / name, spec, direct=direct)
        w.write("x", data)
        w.close()
        if not direct:
            assert not w.direct_io
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.slow
def test_a_conversion_into_tmpfs_gives_the_same_bytes(tmp_path, synth_source):
    if not _shm_tmpfs():
        pytest.skip("/dev/shm is not a writable tmpfs here")
    src = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4, hidden=512, intermediate=256)
    disk = tmp_path / "out"
    shm = SHM / f"dsv4-convert-test-{os.getpid()}-{tmp_path.name}"
    try:
        for out in (disk, shm):
            run_cli("nvfp4-to-marlin", src, out, "--target", "sglang", "-q", "--workers", "1")
        a, b = tree_hashes(shm), tree_hashes(disk)
        for name in ("SERVING.md", MANIFEST):  # they name OUT
            a.pop(name), b.pop(name)
        assert a == b and any(n.endswith(".safetensors") for n in a)
        ma, mb = (json.loads((out / MANIFEST).read_text()) for out in (shm, disk))
        ma["files"].pop("SERVING.md"), mb["files"].pop("SERVING.md")
        assert ma["shards"] == mb["shards"] and ma["files"] == mb["files"]
    finally:
        shutil.rmtree(shm, ignore_errors=True)
