"""The version of dsv4-convert. One home: pyproject.toml's [project] version, read from the installed
package's metadata (so no folder of the checkout holds it or shadows the package)."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("dsv4-convert")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"
