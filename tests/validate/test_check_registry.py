"""The explicit registry (validate/checks/__init__.py: ALL_CHECKS) holds every check the package
defines. The module list is derived from the package itself, so a new check module is covered the
moment it exists; `_`-prefixed modules are helpers and register nothing. The two walks are shown to
fail on a made-up module (types.ModuleType), the only substitution here."""

import importlib
import inspect
import pkgutil
import types

from dsv4_convert.validate import checks
from dsv4_convert.validate.check import Check, Scope, Severity, check
from dsv4_convert.validate.checks import ALL_CHECKS


def _check_modules() -> list[types.ModuleType]:
    return [importlib.import_module(f"{checks.__name__}.{m.name}")
            for m in pkgutil.iter_modules(checks.__path__) if not m.name.startswith("_")]


def _defined_checks(mod: types.ModuleType) -> dict[str, Check]:
    """The checks a module defines (not those it imports from another)."""
    return {name: obj for name, obj in inspect.getmembers(mod, lambda o: isinstance(o, Check))
            if obj.fn.__module__ == mod.__name__}


def _registry_problems(modules, registered) -> list[str]:
    listed = {id(c) for c in registered}
    problems = []
    for mod in modules:
        defined = _defined_checks(mod)
        if not defined:
            problems.append(f"{mod.__name__} defines no check (a helper module's name starts with _)")
        problems += [f"{mod.__name__}.{name} is not in ALL_CHECKS" for name, c in defined.items() if id(c) not in listed]
    return problems


def test_ids_are_unique_and_dotted():
    ids = [c.id for c in ALL_CHECKS]
    assert len(ids) == len(set(ids))
    assert all("." in i and i == i.lower() and " " not in i for i in ids)


def test_every_check_module_registers_every_check_it_defines():
    modules = _check_modules()
    assert len(modules) >= 13, [m.__name__ for m in modules]  # the walk sees the package (13 modules today)
    assert _registry_problems(modules, ALL_CHECKS) == []


def test_every_registered_check_comes_from_a_check_module():
    names = {m.__name__ for m in _check_modules()}
    assert {c.fn.__module__ for c in ALL_CHECKS} <= names


def test_the_walk_sees_an_unlisted_check_and_an_empty_module():
    stray = types.ModuleType(f"{checks.__name__}.stray")

    def fn(*args):
        """a made-up check that nobody registered"""
        yield from ()

    fn.__module__ = stray.__name__
    stray.unlisted = check(id="stray.unlisted", severity=Severity.ERROR, scope=Scope.CHECKPOINT, hint="h")(fn)
    empty = types.ModuleType(f"{checks.__name__}.empty")
    assert _registry_problems([stray, empty], ALL_CHECKS) == [
        f"{stray.__name__}.unlisted is not in ALL_CHECKS",
        f"{empty.__name__} defines no check (a helper module's name starts with _)",
    ]


def test_every_check_says_why_and_how_to_fix():
    for c in ALL_CHECKS:
        assert c.why and c.hint and isinstance(c.severity, Severity), c.id
