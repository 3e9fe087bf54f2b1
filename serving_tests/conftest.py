import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
for p in (HERE, HERE / "stubs"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


@pytest.fixture(scope="session")
def case_dir(tmp_path_factory):
    """Where differential.make_case writes each case's source and conversion once per session: the whole-model
    and the draft differential tests compare the same replicas."""
    return tmp_path_factory.mktemp("cases")


# ---- the served table's proofs (core/targets/served.py): an entry is served on this engine release exactly when its
# proofs pass. A proof of an entry for the installed release that ran and did not pass (failed or skipped), or an
# entry whose proof file was collected without that test, fails the run; a deselected proof is only reported.
_ran: dict[str, str] = {}
_collected: set[str] = set()


def pytest_itemcollected(item):
    _collected.add(item.nodeid)


def pytest_runtest_logreport(report):
    if report.failed or (report.skipped and report.when == "setup"):
        _ran[report.nodeid] = report.outcome
    elif report.when == "call":
        _ran.setdefault(report.nodeid, report.outcome)


def _served_problems() -> tuple[str, list[str]]:
    import importlib.metadata

    from common import installed_engine

    from dsv4_convert.core.targets.served import engine_key, entries

    engine = installed_engine()
    if engine is None:
        return "", []
    key = engine_key(engine, importlib.metadata.version(engine))
    files = {n.split("::")[0] for n in _collected}
    problems = []
    for s in entries(engine=key):
        for proof in s.proofs:
            # a proof named without its parameters stands for every parametrised case of that test
            ids = [n for n in _collected if n == proof or ("[" not in proof and n.startswith(proof + "["))]
            if proof.split("::")[0] in files and not ids:
                problems.append(f"{s.family} {s.source_format} on {key}: its proof {proof} does not exist")
            problems += [f"{s.family} {s.source_format} on {key}: its proof {n} {_ran[n]}"
                         for n in ids if n in _ran and _ran[n] != "passed"]
    return key, problems


def pytest_sessionfinish(session, exitstatus):
    key, problems = _served_problems()
    if problems:
        print(f"\nserved table (core/targets/served.py) not proven on {key}:\n  " + "\n  ".join(problems))
        session.exitstatus = 1
