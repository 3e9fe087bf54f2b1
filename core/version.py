"""The version of dsv4-convert, and how it is installed. One home: pyproject.toml's [project] version,
read from the installed package's metadata (so no folder of the checkout holds it or shadows the package).

dsv4-convert is not published on any package index: pip given the bare project name would fetch whatever
a stranger registers under it. Every text that tells a user how to install it (SERVING.md, `plan`,
hints, docs) says `install_command`: pip given the user's clone (or a wheel built from it)."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["CLONE", "__version__", "install_command", "install_sentence"]

try:
    __version__ = version("dsv4-convert")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"

CLONE = "/path/to/dsv4-convert"  # the user's clone of this project: where every install starts


def install_command(extra: str | None = None) -> str:
    """`pip install /path/to/dsv4-convert` (with `[extra]` quoted for the shell): pip installs a local
    project from its folder; never a package index name, which this project does not own."""
    return f"pip install '{CLONE}[{extra}]'" if extra else f"pip install {CLONE}"


def install_sentence(extra: str | None = None) -> str:
    """The one sentence that says where the install comes from (a clone, or a wheel built from it)."""
    return (f"`{install_command(extra)}` (your clone of dsv4-convert; or a wheel built from it, "
            f"`pip wheel --no-deps -w dist {CLONE}`, then `pip install dist/dsv4_convert-*.whl`)")
