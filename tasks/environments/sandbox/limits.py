"""Host limits on how many sandboxes one process can hold open at once.

The harness engine opens an episode's sandbox on first use and keeps it until the episode is
graded, and the episodes of a shard advance in lock-step, so every sandbox of a shard's episodes
is open at the same time (``rollout.workers`` shards at once on the ``thread`` runner). What that
costs the host, per open sandbox (``benchmarks/sandbox_concurrency.py`` measures it; see the docs'
sandbox section):

- **descriptors** in the host process: :data:`FDS_PER_SANDBOX` (bwrap: its stdin and stdout pipes
  and the unlinked file that keeps its stderr). Every wait on them uses ``poll(2)``, which takes
  any descriptor number (``select(2)`` stops at 1023), so the only bound is RLIMIT_NOFILE:
  :func:`ensure_descriptors` raises the soft limit to the hard one when the plan needs it and
  refuses, in one line, when even the hard limit cannot hold it.
- **processes**: 2 between execs (bwrap and the exec server), under host uid 65534 when the host
  process is root; bounded by ``kernel.pid_max`` and the RLIMIT_NPROC of the host process.
- **memory**: between execs, about 6 MiB of proportional set size (bwrap + an idle Python exec
  server) and 7 MiB of the host's MemAvailable with the kernel's namespace structures (1,000
  sandboxes on an AMD EPYC host, the benchmark's row), plus what the task writes to its tmpfs;
  an exec adds its own processes, at most ``sandbox.parallel`` of them running at once per shard.
  Not checked here: no cgroup bounds the sum (see :mod:`tasks.environments.sandbox.bwrap`).
"""

from __future__ import annotations

import os
import resource
from typing import Any

#: descriptors the host process holds per open sandbox (bwrap: stdin pipe, stdout pipe, stderr
#: file; docker: the attach socket, counted the same so that a plan holds on either backend)
FDS_PER_SANDBOX = {"bwrap": 3, "docker": 3}
#: descriptors left free for everything else the process opens meanwhile (artifacts, sockets,
#: the engine, Prefect's clients)
FD_HEADROOM = 256


class HostLimitError(RuntimeError):
    """The host's limits cannot hold the planned number of open sandboxes."""


def open_descriptors() -> int:
    """Number of descriptors this process holds now (``/proc/self/fd``, Linux; ``os.listdir``'s
    own descriptor not counted)."""
    return len(os.listdir("/proc/self/fd")) - 1


def ensure_descriptors(sandboxes: int, backend: str, what: str) -> int:
    """Make room for ``sandboxes`` more open sandboxes of ``backend`` in this process: needed =
    descriptors open now + ``sandboxes`` x :data:`FDS_PER_SANDBOX` + :data:`FD_HEADROOM`. When the
    soft RLIMIT_NOFILE is below that, it is raised to the hard limit (no privilege needed).

    ``what`` names the caller in the error (e.g. ``"rollout: shard 1/3 (...)"``).

    Returns:
        The soft RLIMIT_NOFILE in force afterwards (descriptors).

    Raises:
        ValueError: ``sandboxes`` < 0 or an unknown ``backend``.
        HostLimitError: the hard limit is below what is needed (one line naming both counts).
    """
    if sandboxes < 0:
        raise ValueError(f"sandboxes={sandboxes} must be >= 0")
    if backend not in FDS_PER_SANDBOX:
        raise ValueError(f"sandbox.backend={backend!r} is not one of {sorted(FDS_PER_SANDBOX)}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = open_descriptors()
    needed = now + sandboxes * FDS_PER_SANDBOX[backend] + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise HostLimitError(
                f"{what}: {sandboxes} {backend} sandboxes may be open at once in this process, which needs {needed} "
                f"descriptors ({now} open now + {FDS_PER_SANDBOX[backend]} per sandbox + {FD_HEADROOM} spare), but "
                f"the hard RLIMIT_NOFILE is {hard}: raise it (ulimit -Hn {needed}, or LimitNOFILE= for a service) "
                "or lower rollout.shard_size or rollout.workers")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def episode_sandboxes(spec: Any, tasks: list[dict[str, Any]], samples: int) -> int:
    """How many of the ``len(tasks) x samples`` episodes of harness ``spec`` open a sandbox: all of
    a workspace task's (the work dir is set up before the first turn), and every episode when the
    harness has a tool that runs in the sandbox (``needs == "sandbox"``); none otherwise (a
    single-reply harness on answer or browser tasks). An upper bound: an episode whose agent never
    calls the tool opens none."""
    from tasks.harnesses.tools import IMPLS

    if samples < 0:
        raise ValueError(f"samples={samples} must be >= 0")
    if any(IMPLS[t.impl_name].needs == "sandbox" for t in spec.tools):
        return len(tasks) * samples
    return sum(samples for t in tasks if t.get("environment") == "workspace")


def planned_sandboxes(per_shard: list[int], task_runner: str, workers: int) -> int:
    """The most sandboxes open at once in the calling process when shards holding ``per_shard``
    sandboxes each run on ``task_runner`` with ``workers`` threads: the largest shard
    (``serial``), the sum of the ``workers`` largest (``thread``), 0 for ``dask`` and ``ray``,
    whose shards run in worker processes (each checks its own shard, :func:`ensure_descriptors`
    in ``run_shard``)."""
    if task_runner == "serial":
        return max(per_shard, default=0)
    if task_runner == "thread":
        return sum(sorted(per_shard, reverse=True)[:max(1, workers)])
    if task_runner in ("dask", "ray"):
        return 0
    raise ValueError(f"rollout.task_runner={task_runner!r} is not one of serial, thread, dask, ray")
