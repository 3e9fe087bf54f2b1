"""The README's layering claim, checked on the source: every `dsv4_convert` import (module level or
inside a function) of every file, parsed with ast, must follow an allowed arrow, and no two modules
may import each other through any chain (no circles). No exceptions are listed: there are none.

Imports may be absolute (`from dsv4_convert.core.files import X`) or relative (`from ..core.files
import X`); relative ones are resolved as Python resolves them. The layers are the folders, and each folder is the subpackage of its name (pyproject.toml's
package-dir, read here, is the one home of that mapping):

  formats  -> nothing of the project (pure codecs)
  core     -> formats
  runtime  -> core
  convert, validate, serving, planner, synth -> core, formats, runtime
  cli      -> everything

`dsv4_convert` itself is a namespace (the version is core/version.py's). No substitutions: the
real tree is read; the last tests run the same checker over a small tree made to break each rule.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
ROOT_PACKAGE = "dsv4_convert"

ALLOWED = {
    "formats": set(),
    "core": {"formats"},
    "runtime": {"core"},
    "convert": {"core", "formats", "runtime"},
    "validate": {"core", "formats", "runtime"},
    "serving": {"core", "formats", "runtime"},
    "planner": {"core", "formats", "runtime"},
    "synth": {"core", "formats", "runtime"},
    "cli": {"core", "formats", "runtime", "convert", "validate", "serving", "planner", "synth"},
}


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """layer -> folder, from pyproject.toml (every top-level subpackage is a layer)."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {pkg.split(".")[1]: folder for pkg, folder in mapping.items() if pkg.count(".") == 1}


def _module_name(root: Path, layer: str, folder: str, path: Path) -> str:
    parts = list(path.relative_to(root / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOT_PACKAGE, layer, *parts])


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from` import names: relative ones (`from ..core.files import X`) resolved against
    the importing module's package, as Python resolves them."""
    if node.level == 0:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    assert node.level <= len(package), f"{module}: relative import beyond the top-level package"
    return ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))


def _imports(path: Path, module: str):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, path.name == "__init__.py")
            yield target
            yield from (f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (the names that are modules of the tree)."""
    files = {}
    for layer, folder in package_dirs(root).items():
        for path in (root / folder).rglob("*.py"):
            files[_module_name(root, layer, folder, path)] = path
    graph = {}
    for module, path in files.items():
        # a module's own packages are imported before it (Python imports every parent first), so naming one
        # (`from . import sibling`, `from dsv4_convert.formats import codec`) is no arrow of its own
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        graph[module] = {m for m in _imports(path, module) if m in files and m != module and m not in ancestors}
    return graph


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == ROOT_PACKAGE else None


def bad_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                  if _layer(src) != _layer(dst) and _layer(dst) not in ALLOWED[_layer(src)])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_folder_is_the_subpackage_of_its_name():
    dirs = package_dirs()
    assert set(dirs) == set(ALLOWED), "a layer without a rule, or a rule without a layer"
    assert all(dirs[layer] == layer for layer in dirs), dirs


def test_every_import_follows_an_allowed_arrow():
    graph = import_graph()
    assert sum(map(len, graph.values())) > 100, "too few project imports found: the tree walk is broken"
    assert bad_arrows(graph) == []


def test_no_import_circles():
    assert circles(import_graph()) == []


def _tiny_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = {"dsv4_convert.formats" = "formats", "dsv4_convert.core" = "core"}\n')
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_checker_sees_an_arrow_up_and_a_circle(tmp_path):
    """The checks can fail: a formats -> core arrow, and a core <-> core circle through a function."""
    root = _tiny_tree(tmp_path, {
        "formats/__init__.py": "",
        "formats/codec.py": "from dsv4_convert.core.reader import read\n",
        "core/__init__.py": "",
        "core/reader.py": "def read():\n    from dsv4_convert.core import index\n",
        "core/index.py": "from dsv4_convert.core.reader import read\n",
    })
    graph = import_graph(root)
    assert bad_arrows(graph) == ["dsv4_convert.formats.codec -> dsv4_convert.core.reader"]
    assert circles(graph) == [["dsv4_convert.core.index", "dsv4_convert.core.reader"]]


def test_the_checker_reads_relative_imports(tmp_path):
    """The same arrow up and circle, spelled relative (`from ..core.reader`, `from .reader`, `from . import`)."""
    root = _tiny_tree(tmp_path, {
        "formats/__init__.py": "",
        "formats/codec.py": "from ..core.reader import read\n",
        "core/__init__.py": "",
        "core/reader.py": "def read():\n    from . import index\n",
        "core/index.py": "from .reader import read\n",
    })
    graph = import_graph(root)
    assert bad_arrows(graph) == ["dsv4_convert.formats.codec -> dsv4_convert.core.reader"]
    assert circles(graph) == [["dsv4_convert.core.index", "dsv4_convert.core.reader"]]
    assert graph["dsv4_convert.core.reader"] == {"dsv4_convert.core.index"}  # its own package is no arrow


def test_the_checker_passes_a_clean_tree(tmp_path):
    root = _tiny_tree(tmp_path, {
        "formats/__init__.py": "", "formats/codec.py": "import numpy\n",
        "core/__init__.py": "", "core/reader.py": "from dsv4_convert.formats.codec import x\n",
    })
    graph = import_graph(root)
    assert graph["dsv4_convert.core.reader"] == {"dsv4_convert.formats.codec"}
    assert bad_arrows(graph) == [] and circles(graph) == []
