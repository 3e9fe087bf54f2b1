"""The Ray executor: each job is a Ray task that declares one CPU and its memory (`task_memory`), is
retried by Ray when its worker or node dies (`max_retries`), and reports progress to one small actor
that the driver reads into one bar of bytes for the whole cluster. Imported only for --executor ray."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..core.errors import DsvError, OutputError, UsageError
from .jobs import RunDir, one_thread_per_job, task_memory
from .settings import settings

__all__ = ["RayExecutor"]

MAX_RETRIES = 3  # a job whose worker or node dies is run again, up to this many times
_PROBE_TIMEOUT_S = 120
_CONNECT_TIMEOUT_S = 5  # a TCP connect to the head node: an answer comes within milliseconds on a LAN
_FLUSH_S = 0.25


@ray.remote(num_cpus=0)
class _Progress:
    """Bytes done per job (this attempt): a retried job starts again from zero, the sum never double counts."""

    def __init__(self):
        self.done: dict[int, int] = {}

    def set(self, job: int, n: int) -> None:
        self.done[job] = n

    def total(self) -> int:
        return sum(self.done.values())


def _run_job(fn, args, job: int, progress, token_file: str, token: str, reports_progress: bool):
    _check_token(token_file, token)
    one_thread_per_job()
    if not reports_progress:
        return fn(*args)
    state = {"n": 0, "sent": 0.0}

    def tick(n: int) -> None:
        state["n"] += n
        if time.monotonic() - state["sent"] > _FLUSH_S:
            progress.set.remote(job, state["n"])
            state["sent"] = time.monotonic()

    result = fn(*args, callback=tick)
    progress.set.remote(job, state["n"])
    return result


def _check_token(token_file: str, token: str) -> None:
    """A task starts only where it sees this run's scratch directory: a node without the shared
    filesystem, or a task of a run that a --resume has fenced, stops here. (validate writes nothing.)"""
    if not token_file:
        return
    try:
        seen = Path(token_file).read_text()
    except OSError:
        seen = None
    if seen != token:
        raise OutputError(f"{socket.gethostname()} does not see {token_file} (no shared filesystem at this path, "
                          "or the run was taken over by --resume)", error_id="convert.not_shared",
                          hint="mount IN and OUT at the same path on every node (docs/SCALE.md)")


def _probe(token_file: str, token: str, inputs: dict[str, int], reply: str) -> str | None:
    """On one node: the reason it cannot take part, or None (and a reply file the driver looks for)."""
    try:
        _check_token(token_file, token)
    except OutputError as e:
        return e.message
    for path, size in inputs.items():
        try:
            if os.stat(path).st_size != size:
                return f"{path} has another size there"
        except OSError as e:
            return f"cannot read {path} ({e.strerror})"
    if reply:
        Path(reply).write_text(socket.gethostname())
    return None


class RayExecutor:
    def threads_for(self, job_bytes: int) -> int:
        """A task is given one CPU, whatever its size."""
        return self.threads_per_job

    def __init__(self, address: str | None, bar=None, *, max_in_flight: int | None = None):
        self.bar, self.max_in_flight = bar, max_in_flight
        self.threads_per_job = 1  # a task is given one CPU (one_thread_per_job in the task)
        self.run: RunDir | None = None
        self.pending: list = []
        self.owned = not ray.is_initialized()  # a caller that connected itself keeps its connection
        if not self.owned:
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = address or settings().ray_address or "local"  # "local": always a new cluster, never
        # one that a `ray start` left on this machine
        kwargs = dict(logging_level="ERROR", log_to_driver=False)
        if address == "local":  # a cluster of this machine alone, for this run
            kwargs.update(include_dashboard=False, _node_ip_address="127.0.0.1")
        elif _is_loopback(address):
            kwargs["_node_ip_address"] = "127.0.0.1"
        if address not in ("local", "auto"):
            _refuse_unreachable(address)  # Ray itself retries a dead address for minutes
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"cannot connect to the Ray cluster at {address}: {e}", error_id="usage.ray_address",
                             hint="start it with `ray start --head` (docs/SCALE.md), or check --ray-address / "
                                  "RAY_ADDRESS; 'Authentication token is missing' means the cluster runs with "
                                  "token auth: set RAY_AUTH_TOKEN (or ~/.ray/auth_token) to its token, or start "
                                  "it and this command with the same RAY_AUTH_MODE") from None

    def check_paths(self, run: RunDir | None, inputs: list[Path]) -> None:
        """A tiny task on every node with CPUs: it must see this run's token file in OUT.partial and every
        input file at the same path and size, and write a reply the driver then sees. Refuses otherwise."""
        self.run = run
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        sizes = {str(p): p.stat().st_size for p in inputs}
        refs = {}
        for n in nodes:
            reply = run.path / f"node-{n['NodeID'][:12]}" if run else None
            strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            refs[n["NodeManagerAddress"] + " " + n["NodeID"][:12]] = (reply, ray.remote(_probe).options(
                num_cpus=0, scheduling_strategy=strategy, max_retries=0).remote(
                str(run.token_file) if run else "", run.token if run else "", sizes, str(reply or "")))
        try:
            answers = ray.get([ref for _, ref in refs.values()], timeout=_PROBE_TIMEOUT_S)
        except GetTimeoutError:
            raise UsageError(f"not every Ray node answered the shared-path check within {_PROBE_TIMEOUT_S} s",
                             error_id="usage.ray_not_shared", hint="check `ray status`") from None
        for (node, (reply, _)), why in zip(refs.items(), answers):
            if why is None and reply is not None and not reply.exists():
                why = f"it wrote {reply}, which this driver does not see"
            if why is not None:
                raise UsageError(f"Ray node {node} cannot take part: {why}", error_id="usage.ray_not_shared",
                                 hint="every node must see IN and OUT at the same path (a shared filesystem); "
                                      "see docs/SCALE.md")

    def map(self, fn, argsets, on_result, *, reports_progress: bool = False, job_bytes=None) -> None:
        argsets = list(argsets)
        job_bytes = job_bytes or [0] * len(argsets)
        token_file, token = (str(self.run.token_file), self.run.token) if self.run else ("", "")
        progress = _Progress.remote()
        remote = ray.remote(_run_job)
        todo = list(range(len(argsets)))[::-1]
        refs: dict = {}
        limit = self.max_in_flight or len(argsets)
        shown = 0
        while todo or refs:
            while todo and len(refs) < limit:
                i = todo.pop()
                refs[remote.options(num_cpus=1, memory=task_memory(job_bytes[i]), max_retries=MAX_RETRIES,
                                    retry_exceptions=False).remote(
                    fn, argsets[i], i, progress, token_file, token, reports_progress)] = i
            self.pending = list(refs)
            done, _ = ray.wait(list(refs), num_returns=1, timeout=0.2)
            if reports_progress and self.bar is not None:
                shown = self._show(ray.get(progress.total.remote()), shown)
            for ref in done:
                del refs[ref]
                on_result(_result(ref))
        self.pending = []
        if reports_progress and self.bar is not None:
            self._show(ray.get(progress.total.remote()), shown)
        ray.kill(progress)

    def _show(self, total: int, shown: int) -> int:
        if total > shown:
            self.bar.update(total - shown)
            return total
        return shown

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:
            for ref in self.pending:
                ray.cancel(ref, force=True)
        if self.owned:
            ray.shutdown()


def _result(ref):
    try:
        return ray.get(ref)
    except RayTaskError as e:  # the job raised: give the driver the job's own error
        cause = getattr(e, "cause", None)
        if isinstance(cause, (DsvError, OSError)):
            raise cause from None
        raise
    except RayError as e:  # its worker or node died more than MAX_RETRIES times, or it ran out of memory
        raise OutputError(f"a Ray task died {MAX_RETRIES + 1} times ({type(e).__name__}); the partial output "
                          "was removed", error_id="convert.worker_died",
                          hint="check the nodes' memory (`ray status`), then rerun") from None


def _refuse_unreachable(address: str) -> None:
    """Fail within seconds, naming the address as given, when nothing answers at HOST:PORT (Ray's own
    connection attempts retry for many minutes, and then name the address they resolved instead)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"the Ray address {address!r} is not HOST:PORT", error_id="usage.ray_address",
                         file=address, hint="give the head node's address as printed by `ray start --head`, "
                                            "e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(f"nothing answers at the Ray address {address} ({e.strerror or e})",
                         error_id="usage.ray_address", file=address,
                         hint="start the cluster with `ray start --head` (docs/SCALE.md), or check --ray-address / "
                              "RAY_ADDRESS and the firewall") from None


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
