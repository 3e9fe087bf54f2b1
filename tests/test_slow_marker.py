"""The slow marker that the fast loop (`-m "not slow"`) relies on: tests/conftest.py tells run_cli
which running test is unmarked, and run_cli warns when such a test starts the CLI. No substitutions:
the real hook and the real CLI."""

import pytest

from tests.helpers import cli


def test_an_unmarked_test_is_known_to_run_cli(request):
    assert cli.UNMARKED_TEST == request.node.nodeid


@pytest.mark.slow
def test_a_marked_test_is_not(request):
    assert cli.UNMARKED_TEST is None


@pytest.mark.slow
def test_run_cli_warns_for_an_unmarked_test(monkeypatch):
    monkeypatch.setattr(cli, "UNMARKED_TEST", "tests/x.py::test_y")
    with pytest.warns(cli.NotMarkedSlow, match=r"tests/x.py::test_y starts the CLI: mark it slow"):
        assert cli.run_cli("--help").returncode == 0
