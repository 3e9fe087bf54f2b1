"""--executor ray on a real two-node Ray cluster (two `ray start` processes on 127.0.0.1, one CPU each),
reused by the whole module: every source format converts to the same bytes as the local executor,
validate's report is the same, marlin-to-source gives the input back, a worker SIGKILLed by pid
mid-run is retried by Ray with identical output, and a driver SIGKILLed mid-run leaves OUT.partial
that --resume (ray or local) completes to the same bytes.

Substitutions: the two "nodes" are two raylets on one machine (so the shared filesystem is the local
disk), with token authentication off (RAY_AUTH_MODE=disabled, see ENV); the nodes run with the test
hooks (tests/hooks/sitecustomize.py on their PYTHONPATH) and DSV4_CONVERT_PAUSE_TASK naming an arm file:
while a test arms it, one task writes its pid and waits so the test can kill it at a known moment; the
format sweep calls the CLI's main() for all six formats in one subprocess that connected to Ray once (one Ray job: its workers import torch once, not six times, to
keep CI short). Everything else is real: Ray, the CLI in subprocesses, files on disk."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tests.helpers.cli import CLI, restored_tree, run_cli, tree_hashes, with_hooks

RAY = Path(sys.executable).with_name("ray")
COMMAND = {"mxfp4": "mxfp4-to-marlin", "nvfp4": "nvfp4-to-marlin"}
SMALL = ("--max-shard-size", "120KB", "-q")  # several shards from a tiny checkpoint
# RAY_AUTH_MODE: Ray 2.60's daemons turn token authentication on when ~/.ray/auth_token exists (left
# by an earlier `ray get-auth-token --generate` on the machine) while a client that was not told the
# mode connects without a token and is refused; the test cluster is private to the test, so say it.
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
ARM = "pause-arm"  # in the cluster's folder: holds the path of the pid file the next paused task writes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], tmp: Path, name: str) -> subprocess.Popen:
    log = open(tmp / f"{name}.log", "w")
    # through this interpreter, not the script's shebang: a copied venv's scripts name another tree's Python,
    # whose nodes would then import that tree's dsv4_convert
    return subprocess.Popen([sys.executable, str(RAY), "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                             "--object-store-memory=80000000", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **ENV, DSV4_CONVERT_PAUSE_TASK=str(tmp / ARM),
                                     PYTHONPATH=with_hooks(os.environ.get("PYTHONPATH"))), start_new_session=True)


@pytest.fixture(scope="module")
def ray_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
def cluster(ray_dir):
    """A head and one worker node; yields the address. Stopped by process group (only what it started)."""
    tmp = ray_dir
    port = _free_port()
    address = f"127.0.0.1:{port}"
    procs = [_start(["--head", f"--port={port}", "--include-dashboard=false", "--disable-usage-stats"], tmp, "head")]
    try:
        _wait_nodes(address, 1, procs, tmp)
        procs.append(_start([f"--address={address}"], tmp, "worker"))
        _wait_nodes(address, 2, procs, tmp)
        yield address
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)


def _wait_nodes(address: str, n: int, procs, tmp: Path) -> None:
    code = (f"import ray; ray.init(address='{address}', _node_ip_address='127.0.0.1', logging_level='ERROR');"
            "print(sum(1 for x in ray.nodes() if x['Alive']))")
    deadline = time.monotonic() + 300  # a guard against a cluster that never comes up, not a speed claim
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), (tmp / "head.log").read_text()[-2000:]
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, **ENV))
        if out.returncode == 0 and out.stdout.strip() == str(n):
            return
        time.sleep(1)
    raise AssertionError(f"the Ray cluster did not reach {n} nodes")


def _ray(address: str) -> tuple[str, ...]:
    return ("--executor", "ray", "--ray-address", address)


def _command(fmt: str) -> str:
    return COMMAND[fmt.split("-")[0]]


def _converted(tmp: Path, name: str, src: Path, fmt: str, *extra) -> dict:
    out = tmp / name / "out"  # the same basename everywhere: SERVING.md names the output directory
    run_cli(_command(fmt), src, out, *SMALL, *extra, env=ENV)
    return tree_hashes(out)


FORMATS = ("mxfp4-dsv4", "nvfp4-modelopt-dsv4", "nvfp4-modelopt-hf", "nvfp4-ct", "mxfp4-ct", "mxfp4-gptoss")


def _main_many(argvs: list[list], address: str | None = None) -> None:
    """Run the CLI's main() for each argv in one subprocess (connected to Ray once when `address`)."""
    code = ("import json, sys\n"
            + (f"import ray; ray.init(address={address!r}, _node_ip_address='127.0.0.1', logging_level='ERROR')\n"
               if address else "")
            + "from dsv4_convert.cli.main import main\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as e:\n"
            "        assert e.code in (0, None), (argv, e.code)\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([[str(a) for a in v] for v in argvs])],
                          capture_output=True, text=True, env=dict(os.environ, **ENV))
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_every_format_converts_to_the_same_bytes_as_local(tmp_path, synth_source, cluster):
    cases = {fmt: (fmt, ()) for fmt in FORMATS}
    cases["vllm"] = ("nvfp4-modelopt-dsv4", ("--target", "vllm"))  # vllm + bf16: the rescale pass runs as tasks too
    for name, extra, address in (("local", (), None), ("ray", _ray(cluster), cluster)):
        _main_many([[_command(f), synth_source(f, experts=4), tmp_path / name / case / "out", *SMALL, *more, *extra]
                    for case, (f, more) in cases.items()], address)
    for case in cases:
        local = tree_hashes(tmp_path / "local" / case / "out")
        assert len([f for f in local if f.endswith(".safetensors")]) >= 3, "the test needs several shards"
        assert tree_hashes(tmp_path / "ray" / case / "out") == local, case


def test_validate_report_is_the_same(tmp_path, synth_source, cluster):
    fmt = "nvfp4-modelopt-dsv4"
    src = synth_source(fmt, experts=4)
    _converted(tmp_path, "local", src, fmt, "--target", "vllm")
    out = tmp_path / "local" / "out"
    reports = []
    for extra in ((), _ray(cluster)):
        proc = run_cli("validate", out, "--against", src, "--json", *extra, env=ENV)
        report = json.loads(proc.stdout)
        report["summary"].pop("seconds", None)
        reports.append(report)
    assert reports[0]["summary"]["experts_checked"] > 0
    assert reports[0] == reports[1]


def test_marlin_to_source_on_ray_gives_the_input_back(tmp_path, synth_source, cluster):
    fmt = "mxfp4-gptoss"
    src = synth_source(fmt, experts=4)
    _converted(tmp_path, "conv", src, fmt)
    back = tmp_path / "back"
    run_cli("marlin-to-source", tmp_path / "conv" / "out", back, "-q", *_ray(cluster), env=ENV)
    assert restored_tree(back) == tree_hashes(src)


def _start_paused(src: Path, out: Path, pid_file: Path, address: str, ray_dir: Path) -> tuple[subprocess.Popen, int]:
    """Start a ray conversion whose first task stops mid-shard; returns the driver and that worker's pid."""
    arm = ray_dir / ARM
    arm.write_text(str(pid_file))
    try:
        driver = subprocess.Popen([*CLI, "nvfp4-to-marlin", str(src), str(out), *SMALL, "--resume", *_ray(address)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **ENV))
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()):
            assert driver.poll() is None, driver.communicate()[1]
            assert time.monotonic() < deadline, "no task reached the pause hook"
            time.sleep(0.1)
    finally:
        arm.unlink()  # the retried task, and every later test, runs unpaused
    return driver, int(pid_file.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, synth_source):
    src = synth_source("nvfp4-modelopt-dsv4", experts=4)
    return src, _converted(tmp_path_factory.mktemp("ref"), "local", src, "nvfp4-modelopt-dsv4")


def test_a_worker_killed_mid_run_is_retried_and_the_output_is_identical(tmp_path, reference, cluster, ray_dir):
    src, expected = reference
    out = tmp_path / "ray" / "out"
    driver, worker = _start_paused(src, out, tmp_path / "pid", cluster, ray_dir)
    assert worker != driver.pid
    os.kill(worker, signal.SIGKILL)
    _, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err
    assert tree_hashes(out) == expected


@pytest.mark.parametrize("resume_on", ["ray", "local"])
def test_a_driver_killed_mid_run_leaves_a_partial_that_resume_completes(tmp_path, reference, cluster, resume_on,
                                                                       ray_dir):
    src, expected = reference
    out = tmp_path / "ray" / "out"
    partial = out.with_name("out.partial")
    driver, _ = _start_paused(src, out, tmp_path / "pid", cluster, ray_dir)
    progress = partial / "dsv4-convert.progress.json"
    deadline = time.monotonic() + 120
    while not json.loads(progress.read_text() if progress.exists() else "{}").get("shards"):
        assert time.monotonic() < deadline, "the other node finished no shard"
        time.sleep(0.1)
    driver.kill()
    driver.wait()
    assert partial.is_dir() and not out.exists()
    assert list(partial.glob(".run-*")), "the killed run's scratch directory is left for the fence"
    run_cli("nvfp4-to-marlin", src, out, *SMALL, "--resume", *(_ray(cluster) if resume_on == "ray" else ()), env=ENV)
    assert tree_hashes(out) == expected
    assert not partial.exists()
    assert not list(out.parent.glob("out.partial.fenced-*")), "the fenced scratch directory is removed"
