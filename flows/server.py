"""Letting Prefect's temporary server finish its work before the run's process exits.

Without ``PREFECT_API_URL`` a process that runs a flow starts a temporary Prefect server (a
uvicorn subprocess) and stops it at exit with SIGTERM. The server takes in the run's events
(task-run and flow-run states) asynchronously: its event persister and its task-run recorder
write them to SQLite in background services, the recorder one event per transaction, so on a
busy host it lags the run by seconds. Stopped while one of them is writing, the service is
cancelled mid-transaction: the server prints ``ERROR | sqlalchemy.pool.impl.AsyncAdaptedQueuePool
- Exception during reset`` (or ``task_run_recorder - Error flushing``) with a ``CancelledError``
traceback after the run's output, and the last task-run states are lost.

:func:`settle_temporary_server` waits until both have caught up: a last event
(``harnessrl.run.settled``) is emitted and the server polled until the persister has stored it
(the events reach the server in order, so every earlier one is stored too), then until every
task run the stored events name has, in the database, the state of its latest event (the
recorder's work). Prefect's exit handlers then drain the client's queues and stop an idle server.

Prefect stops its temporary server from an exit handler, which a killed process never runs.
:func:`start_temporary_server` starts it before the run (as Prefect's client would at its first
call) and :func:`end_with_this_process` hands its pid to a watch process (:mod:`flows.reaper`)
that ends it once this process is gone, SIGKILL included.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

SETTLED_EVENT = "harnessrl.run.settled"
_REAPER: dict[str, Any] = {}  # the watch process and the write end of its pipe (one per process)


def end_with_this_process(pid: int) -> None:
    """Have process ``pid`` ended (SIGTERM, then SIGKILL after 3 s) when this process exits, by
    any means: the first call starts the watch process :mod:`flows.reaper`, which holds the read
    end of a pipe whose only write end stays in this process (not inherited by other children);
    end-of-file on it means this process is gone.

    Raises:
        psutil.NoSuchProcess: ``pid`` is not running.
    """
    import psutil

    created = psutil.Process(pid).create_time()
    if "fd" not in _REAPER:
        r, w = os.pipe()  # both non-inheritable; the reaper gets r through pass_fds
        _REAPER["proc"] = subprocess.Popen([sys.executable, str(Path(__file__).with_name("reaper.py")), str(r)],
                                           pass_fds=(r,), stdin=subprocess.DEVNULL)
        os.close(r)
        _REAPER["fd"] = w
    os.write(_REAPER["fd"], f"{pid} {created!r}\n".encode())


def start_temporary_server() -> int | None:
    """Without ``PREFECT_API_URL``, start Prefect's temporary server now (the same instance its
    client starts at the first API call) and have it end with this process
    (:func:`end_with_this_process`). Returns the server's pid, or None when an API of one's own is
    configured (nothing started)."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    assert server.server_process is not None
    end_with_this_process(server.server_process.pid)
    return server.server_process.pid


def settle_temporary_server(since: _dt.datetime, timeout_s: float = 120.0) -> bool:
    """When this process runs against Prefect's temporary server, wait (at most ``timeout_s``)
    until the server has stored every event sent since ``since`` (UTC) and recorded every task
    run's latest state. Returns True once it has; False when there is no temporary server (a
    ``PREFECT_API_URL`` of one's own, which stays up and needs no wait) or it did not catch up in
    time."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return False
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.get(None)
    if server is None or not server.running or server.server_process is None:
        return False
    import httpx
    from prefect.events import emit_event

    deadline = time.monotonic() + timeout_s
    event = emit_event(event=SETTLED_EVENT, resource={"prefect.resource.id": f"harnessrl.run.{uuid.uuid4()}"})
    if event is None:  # events are off: the server records nothing from them
        return True
    try:
        return _wait(server.api_url, event, since, deadline)
    except (httpx.HTTPError, KeyError, ValueError):  # the server went away or answered oddly: nothing to wait for
        return False


def _wait(api: str, event: Any, since: _dt.datetime, deadline: float) -> bool:
    """Poll until ``event`` is stored, then until the task runs are recorded; False at ``deadline``."""
    import httpx

    with httpx.Client(timeout=30.0) as client:
        def stored() -> bool:
            r = client.post(f"{api}/events/filter", json={"filter": {"id": {"id": [str(event.id)]}}, "limit": 1})
            return r.status_code == 200 and bool(r.json().get("events"))

        while not stored():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        latest = _latest_task_run_events(client, api, since)
        while not _recorded(client, api, latest):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
    return True


def _latest_task_run_events(client: Any, api: str, since: _dt.datetime) -> dict[str, str]:
    """``{task run id: id of its latest client-side state event}`` over the stored events that
    occurred since ``since``."""
    body = {"filter": {"occurred": {"since": since.astimezone(_dt.timezone.utc).isoformat()},
                       "event": {"prefix": ["prefect.task-run."]}}, "limit": 50}
    r = client.post(f"{api}/events/filter", json=body)
    r.raise_for_status()
    page = r.json()
    latest: dict[str, tuple[str, str]] = {}
    while True:
        for e in page["events"]:
            res = e["resource"]
            if res.get("prefect.orchestration") != "client":
                continue
            run_id = res["prefect.resource.id"].removeprefix("prefect.task-run.")
            if run_id not in latest or e["occurred"] > latest[run_id][0]:
                latest[run_id] = (e["occurred"], e["id"])
        if not page.get("next_page"):
            break
        r = client.get(page["next_page"])
        r.raise_for_status()
        page = r.json()
    return {k: v[1] for k, v in latest.items()}


def _recorded(client: Any, api: str, latest: dict[str, str]) -> bool:
    """Whether every task run of ``latest`` is in the database with that event as its state."""
    ids = sorted(latest)
    for i in range(0, len(ids), 200):
        r = client.post(f"{api}/task_runs/filter", json={"task_runs": {"id": {"any_": ids[i:i + 200]}}, "limit": 200})
        if r.status_code != 200:
            return False
        got = {t["id"]: t.get("state_id") for t in r.json()}
        if any(got.get(k) != latest[k] for k in ids[i:i + 200]):
            return False
    return True
