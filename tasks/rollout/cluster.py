"""Watching the worker processes of a Dask or Ray fan-out (:mod:`tasks.rollout.fanout`).

- :func:`follow_api_url`, run on every Dask worker before a fan-out submits its shards: Prefect
  keeps one events worker, one log worker and one concurrency-slot service per process, bound to
  the API they first reported to. A Dask worker reused by a later run would keep sending that
  run's shard task runs and logs to the first run's (temporary, long gone) Prefect server, and
  fail to take the task's concurrency slot there; on a change of API URL the stale services are
  drained and stopped, so the next event starts services bound to the current run's API.
- :func:`live_workers` and :func:`await_shard`: a fan-out whose every worker has died would wait
  for its shards forever (the Dask scheduler keeps them until a worker joins); it fails instead,
  after ``rollout.worker_timeout_s`` seconds with no live worker, with one line naming the cluster.
"""

from __future__ import annotations

import time
from typing import Any

# the default of rollout.worker_timeout_s (None): seconds a fan-out waits with no live worker
DEFAULT_WORKER_TIMEOUT_S = 300.0
_POLL_S = 2.0
_API_URL_SEEN: list[str | None] = []  # the PREFECT_API_URL this process's services were started for


class NoWorkersError(RuntimeError):
    """Every worker of a Dask or Ray fan-out has been gone for ``rollout.worker_timeout_s``."""


def follow_api_url(url: str | None = None, services: tuple[Any, ...] | None = None) -> bool:
    """Drain and stop this process's Prefect services when the run's API URL has changed since the
    last call (a reused worker serving a new run); returns whether it did.

    Prefect's task engine emits a task run's events and takes its concurrency slots through
    per-process services (events worker, log worker, concurrency-slot service) started for the
    API URL of the first run the process served; they must be stopped before the next run's task
    engine starts, so the fan-out calls this on every Dask worker (``client.run``) before it
    submits a shard. Ray needs no call: each Ray job (each run) gets its own worker processes.

    Args:
        url: the run's API URL (default: ``PREFECT_API_URL`` in this process's settings).
        services: the service classes to stop (default every Prefect queue service of the
            process: ``drain_all`` of Prefect's service base drains them all); each needs a
            ``drain_all(timeout=...)`` classmethod.
    """
    if url is None:
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value()
    changed = bool(_API_URL_SEEN) and _API_URL_SEEN[0] != url
    if changed:
        if services is None:
            from prefect._internal.concurrency.services import _QueueServiceBase

            services = (_QueueServiceBase,)
        for svc in services:
            svc.drain_all(timeout=5.0)  # whatever the old API did not take in 5 s is dropped
    _API_URL_SEEN[:] = [url]
    return changed


def live_workers(runner: Any, task_runner: str) -> int | None:
    """Worker processes able to run a shard now: Dask workers known to the scheduler, or alive Ray
    nodes with a CPU. None when it cannot be told (an unknown runner, or the query failed)."""
    try:
        if task_runner == "dask":
            return len(runner.client.nthreads())
        if task_runner == "ray":
            import ray

            return sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)
    except Exception:  # noqa: BLE001 - a failed query is "cannot tell", not "no workers"
        return None
    return None


def _done(fut: Any, task_runner: str, timeout: float) -> bool:
    wrapped = fut.wrapped_future
    if task_runner == "dask":  # polled: distributed.wait needs a default client, which the runner need not set
        end = time.monotonic() + timeout
        while not wrapped.done() and time.monotonic() < end:
            time.sleep(min(0.1, timeout))
        return wrapped.done()
    if task_runner == "ray":
        import ray

        ready, _ = ray.wait([wrapped], timeout=timeout)
        return bool(ready)
    return True


def await_shard(fut: Any, runner: Any, task_runner: str, where: str, timeout_s: float, *,
                poll_s: float = _POLL_S, clock: Any = time.monotonic) -> None:
    """Block until ``fut`` (a Prefect future of a shard on ``dask`` or ``ray``) is done, polling
    every ``poll_s`` seconds how many workers are alive (:func:`live_workers`).

    Raises:
        NoWorkersError: no live worker for ``timeout_s`` seconds in a row (the message names the
            cluster, ``where``, and the setting).
    """
    last_alive = clock()
    while not _done(fut, task_runner, poll_s):
        n = live_workers(runner, task_runner)
        now = clock()
        if n is None or n > 0:
            last_alive = now
        elif now - last_alive >= timeout_s:
            raise NoWorkersError(f"rollout: no live worker on {where} for {timeout_s:g} s "
                                 "(rollout.worker_timeout_s); start workers or check the cluster")
