"""Real Dask and Ray clusters on 127.0.0.1 for the tests, started with the engines' own command
lines (``dask scheduler`` + ``dask worker``, ``ray start --head``) as a person would start them,
and stopped with every process they spawned.

Each cluster's processes get ``HARNESSRL_TEST_CLUSTER=<unique id>`` in their environment; stopping
a cluster ends the command lines it started (their process groups), then any process still alive
that carries that id (a worker re-parented after its parent died), by pid: never other clusters
on the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.facilities import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARK = "HARNESSRL_TEST_CLUSTER"


def _env(mark: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESSRL_FAULT")}
    env.update({MARK: mark, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONUNBUFFERED": "1", **extra})
    return env


@dataclass
class Cluster:
    """Processes started for one cluster; :meth:`stop` ends all of them."""

    mark: str
    address: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hrl-cl-", dir="/tmp")))

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        self.logs.append(log)
        p = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def log_tail(self, n: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}" for p in self.logs if p.exists())

    def members(self) -> list[psutil.Process]:
        """Live processes of this cluster (by the environment mark), other than this one."""
        out = []
        for p in psutil.process_iter(["pid"]):
            if p.pid == os.getpid():
                continue
            try:
                if p.environ().get(MARK) == self.mark:
                    out.append(p)
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
                continue
        return out

    def stop(self, grace_s: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _ in range(2):
            left = self.members()
            for p in left:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(left, timeout=5)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _wait(ready: Callable[[], bool], cluster: Cluster, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"exited ({dead[0].returncode})" if dead else f"not ready in {timeout_s:.0f} s"
            raise RuntimeError(f"{what} {why}:\n{cluster.log_tail()}")
        time.sleep(0.3)


def start_dask(workers: int, env: dict[str, str] | None = None, timeout_s: float = 90) -> Cluster:
    """``dask scheduler`` on 127.0.0.1 and ``workers`` x ``dask worker --nworkers 1 --nthreads 1``
    (each under its nanny, which restarts a worker process that dies). Returns once every worker
    has registered; ``address`` is the scheduler's ``tcp://`` address."""
    import distributed

    cl = Cluster(uuid.uuid4().hex)
    e = _env(cl.mark, env or {})
    port = free_port()
    cl.address = f"tcp://127.0.0.1:{port}"
    cl.start("scheduler", [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                           "--dashboard-address", ":0", "--no-show"], e)
    for i in range(workers):
        cl.start(f"worker-{i}", [str(BIN / "dask"), "worker", cl.address, "--nworkers", "1", "--nthreads", "1",
                                 "--host", "127.0.0.1", "--dashboard-address", ":0", "--name", f"w{i}",
                                 "--local-directory", str(cl.tmp / f"w{i}")], e)

    def ready() -> bool:
        try:
            with distributed.Client(cl.address, timeout=2) as c:
                return len(c.scheduler_info()["workers"]) >= workers
        except OSError:
            return False

    try:
        _wait(ready, cl, "dask cluster", timeout_s)
    except BaseException:
        cl.stop()
        raise
    return cl


def start_ray(cpus: int, env: dict[str, str] | None = None, timeout_s: float = 120) -> Cluster:
    """``ray start --head --block`` on 127.0.0.1 with ``cpus`` CPUs, no dashboard, its own temp dir
    and free ports; returns once the head answers ``ray status``; ``address`` is ``127.0.0.1:PORT``."""
    cl = Cluster(uuid.uuid4().hex)
    e = _env(cl.mark, env or {})
    port = free_port()
    cl.address = f"127.0.0.1:{port}"
    cl.start("ray-head", [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                          "--port", str(port), "--num-cpus", str(cpus), "--num-gpus", "0",
                          "--include-dashboard", "false", "--disable-usage-stats",
                          "--ray-client-server-port", str(free_port()), "--object-store-memory", str(200 << 20),
                          "--temp-dir", str(cl.tmp / "ray")], e)

    def ready() -> bool:
        r = subprocess.run([str(BIN / "ray"), "status", "--address", cl.address], capture_output=True, text=True,
                           env=e, timeout=60)
        return r.returncode == 0 and "node_" in r.stdout

    try:
        _wait(ready, cl, "ray head", timeout_s)
    except BaseException:
        cl.stop()
        raise
    return cl
