#!/usr/bin/env python3
"""Assemble the SGLang 0.5.23 JIT Marlin test equipment in the git-ignored `.sglang-kernels/` at the repository
root, from the project and the installed engine alone (README.md beside this file says what it is for).

  python tests/gpu/sglang_kernels/prepare.py            # then carry .sglang-kernels to the GPU device
  python tests/gpu/sglang_kernels/prepare.py --check    # only verify the installed sources; writes nothing

The SGLang files (SOURCES.sha256, relative to the equipment's src/) are copied out of the sglang 0.5.23 wheel
installed in .venv-sglang (serving_tests/build_venvs.sh sglang); sgl_kernel/scalar_type.py out of sglang-kernel
0.4.10: an installed copy, --sglang-kernel-wheel WHEEL, or else `pip download` of that wheel (373 MB, deleted
after). Every file must match SOURCES.sha256, else nothing is written and each differing file is named. The two
wheels the JIT loader needs on the device's CPython 3.12 are downloaded by pip and checked against the hashes
below. Standard library only: it runs with any Python 3.10+.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SGLANG_DIST = "sglang-0.5.23.dist-info"
SGLANG_KERNEL = "sglang-kernel==0.4.10"  # sglang 0.5.23's pin (its METADATA; tests/test_sglang_kernel_equipment.py)
KERNEL_PREFIX = "sgl_kernel/"  # the SOURCES entries that come from sglang-kernel, not from sglang
# the device's interpreter (CPython 3.12, x86-64 glibc); the wheels as the equipment was first built with them
WHEELS = {
    "apache-tvm-ffi==0.1.11": ("apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                               "2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128"),
    "msgspec==0.22.0": ("msgspec-0.22.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64"
                        ".whl", "99c401861c5bb3a57f7d6423ea7ed4352cd57aa3f04f4fbe9f3e3e4564a10f08"),
}
DEVICE_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"] + [
    a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                "manylinux2014_x86_64") for a in ("--platform", p)]
COPIED = ("README.md", "SOURCES.sha256", "build.py")  # with stand_in/: the project-made parts


class Refused(Exception):
    """A source that is missing or differs from SOURCES.sha256; the message names every such file."""


def sources(listing: Path = HERE / "SOURCES.sha256") -> dict[str, str]:
    """SOURCES.sha256 (`sha256sum` output, paths `./rel`) as {rel: sha256}."""
    out = {}
    for line in listing.read_text().splitlines():
        digest, rel = line.split(maxsplit=1)
        out[rel.removeprefix("./")] = digest
    return out


def site_packages(venv: Path) -> Path:
    """The venv's site-packages that hold the sglang 0.5.23 wheel."""
    found = sorted(venv.glob(f"lib/python3*/site-packages/{SGLANG_DIST}"))
    if not found:
        raise Refused(f"no sglang 0.5.23 in {venv} (want {SGLANG_DIST}): run serving_tests/build_venvs.sh sglang")
    return found[0].parent


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(files: dict[str, bytes | None], listing: dict[str, str]) -> None:
    """Every listed file present with its listed hash, else Refused naming each one that is not."""
    bad = []
    for rel, want in sorted(listing.items()):
        data = files.get(rel)
        if data is None:
            bad.append(f"  {rel}: missing")
        elif sha256(data) != want:
            bad.append(f"  {rel}: sha256 {sha256(data)}, SOURCES.sha256 says {want}")
    if bad:
        raise Refused(f"{len(bad)} of {len(listing)} source files do not match SOURCES.sha256:\n" + "\n".join(bad))


def read_installed(site: Path, listing: dict[str, str]) -> dict[str, bytes | None]:
    """The listed files as installed in `site` (None where absent)."""
    return {rel: (site / rel).read_bytes() if (site / rel).is_file() else None for rel in listing}


def kernel_files(site: Path, wheel: Path | None, listing: dict[str, str]) -> dict[str, bytes | None]:
    """The sgl_kernel entries: from the given wheel, an installed sgl_kernel, or a downloaded sglang-kernel wheel."""
    rels = [r for r in listing if r.startswith(KERNEL_PREFIX)]
    if wheel is None and all((site / r).is_file() for r in rels):
        return {r: (site / r).read_bytes() for r in rels}
    with tempfile.TemporaryDirectory(prefix="sglang-kernel-") as tmp:
        if wheel is None:
            print(f"[prepare] downloading {SGLANG_KERNEL} (373 MB) for {', '.join(rels)}", flush=True)
            pip_download([SGLANG_KERNEL, "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                          "--platform", "manylinux2014_x86_64"], Path(tmp))
            wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            return {r: z.read(r) if r in names else None for r in rels}


def pip_download(args: list[str], dest: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args], check=True)


def wheels(dest: Path) -> None:
    """The two wheels for the device's CPython 3.12, each checked against WHEELS."""
    dest.mkdir(parents=True)
    pip_download([*WHEELS, *DEVICE_PLATFORM], dest)
    got = {p.name: sha256(p.read_bytes()) for p in dest.glob("*.whl")}
    want = dict(WHEELS.values())
    if got != want:
        raise Refused(f"pip downloaded {sorted(got.items())}, expected {sorted(want.items())}")


def assemble(site: Path, kernel_wheel: Path | None, dest: Path) -> None:
    """Verify, then build the equipment in a staging folder beside `dest` and swap it in (all or nothing)."""
    listing = sources()
    files = read_installed(site, {r: d for r, d in listing.items() if not r.startswith(KERNEL_PREFIX)})
    files.update(kernel_files(site, kernel_wheel, listing))
    verify(files, listing)
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    try:
        for rel, data in files.items():
            (stage / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / "src" / rel).write_bytes(data)
        for name in COPIED:
            shutil.copyfile(HERE / name, stage / name)
        shutil.copytree(HERE / "stand_in", stage / "stand_in", ignore=shutil.ignore_patterns("__pycache__"))
        wheels(stage / "wheels")
        stage.chmod(0o755)
        if dest.exists():
            shutil.rmtree(dest)
        stage.rename(dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-sglang", help="the venv with sglang 0.5.23")
    ap.add_argument("--dest", type=Path, default=REPO / ".sglang-kernels", help="the folder to (re)create")
    ap.add_argument("--sglang-kernel-wheel", type=Path, help=f"a downloaded {SGLANG_KERNEL} wheel to read from")
    ap.add_argument("--check", action="store_true", help="only verify the installed sglang files; write nothing")
    args = ap.parse_args(argv)
    try:
        site = site_packages(args.venv)
        if args.check:
            listing = {r: d for r, d in sources().items() if not r.startswith(KERNEL_PREFIX)}
            verify(read_installed(site, listing), listing)
            print(f"[prepare] {len(listing)} sglang files in {site} match SOURCES.sha256")
            return 0
        assemble(site, args.sglang_kernel_wheel, args.dest)
    except Refused as e:
        print(f"[prepare] refused: {e}", file=sys.stderr)
        return 1
    print(f"[prepare] {args.dest} ready: carry it to the GPU device (tests/gpu/run.sh uses it first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
