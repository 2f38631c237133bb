"""Clean stops of a real ``harnessrl run`` (a subprocess with its own temporary Prefect server, as
a user runs it): SIGTERM and SIGINT end it within 10 s with status 128 + signal, no process of
its group left, the stage record ``Cancelled`` (``harnessrl status``: cancelled) and the Prefect
flow and task runs ``Cancelled``; a rerun resumes; a SIGKILL leaves no server behind.

One run folder and one Prefect home for the three runs (each starts a server: ~10 s on 2 cores):
1. held in freeze's task (``time.sleep``), SIGTERM: the main thread unwinds (flows/stopping.py);
2. rerun: freeze completes, held in rollout's task with the signals blocked in the main thread
   (as a long native call would), SIGINT: the watch thread ends the process after GRACE_S;
3. rerun: freeze Cached, held in rollout again, SIGKILL of the run alone: the reaper ends its server.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from flows.stopping import GRACE_S
from tests.facilities import bwrap_missing, require
from tests.flows.test_ops_faults import REPO, status_of, tiny_config

pytestmark = pytest.mark.slow


def start(cfg_path: Path, rd: Path, home: Path, point: str, hold: str, log: Path) -> subprocess.Popen:
    """``harnessrl run`` in a session of its own, without PREFECT_API_URL (it starts its own
    temporary server), held at fault point ``point``; returns once it is held there."""
    env = {**os.environ, "PREFECT_HOME": str(home), "COLUMNS": "200", "HARNESSRL_PROGRESS": "0",
           "HARNESSRL_FAULT": point, "HARNESSRL_FAULT_HOLD": hold}
    env.pop("PREFECT_API_URL", None)
    with open(log, "w") as f:  # a file, not a pipe: a server left behind would hold a pipe open
        p = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "-c", str(cfg_path), "--run-dir", str(rd)],
                             cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + 240
    while f"fault-hold {point}" not in log.read_text():
        assert p.poll() is None and time.monotonic() < end, log.read_text()
        time.sleep(0.2)
    return p


def group(pgid: int) -> list[psutil.Process]:
    """Processes of process group ``pgid`` still alive (zombies not counted)."""
    out = []
    for q in psutil.process_iter():
        try:
            if os.getpgid(q.pid) == pgid and q.status() != psutil.STATUS_ZOMBIE:
                out.append(q)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def gone_within(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of ``procs`` still running (not zombies) after ``seconds``."""
    _, alive = psutil.wait_procs(procs, timeout=seconds)
    return [q for q in alive if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]


def prefect_states(home: Path, since: str) -> tuple[dict[str, str], dict[str, str]]:
    """``({flow run name: state type}, {task run name: state type})`` of the runs created since
    ``since`` (UTC, 'YYYY-MM-DD HH:MM:SS'), read from the temporary server's SQLite database."""
    db = sqlite3.connect(home / "prefect.db")
    try:
        flows = dict(db.execute("select name, state_type from flow_run where created >= ?", (since,)).fetchall())
        tasks = dict(db.execute("select name, state_type from task_run where created >= ?", (since,)).fetchall())
    finally:
        db.close()
    return flows, tasks


def utc_now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def stop(p: subprocess.Popen, sig: int) -> tuple[int, float, list[psutil.Process], list[str]]:
    """Send ``sig`` to the run alone; returns (exit status, seconds to exit, its children before,
    their command lines)."""
    children = psutil.Process(p.pid).children(recursive=True)
    cmdlines = [" ".join(c.cmdline()) for c in children]
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return rc, time.monotonic() - t0, children, cmdlines


def test_sigterm_sigint_and_sigkill_stop_a_run_cleanly(tiny_model_dir, tmp_path):
    require("bubblewrap", bwrap_missing())
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config(tiny_model_dir, name="stop")))
    rd, home = tmp_path / "run", tmp_path / "prefect-home"
    try:
        # 1. SIGTERM while freeze's task sleeps: the main thread unwinds
        since = utc_now()
        p = start(cfg_path, rd, home, "task:freeze", "120", tmp_path / "1.log")
        rc, seconds, children, cmdlines = stop(p, signal.SIGTERM)
        out = (tmp_path / "1.log").read_text()
        assert rc == 128 + signal.SIGTERM and seconds < 10, (rc, seconds, out)
        assert any("uvicorn" in c for c in cmdlines) and any("reaper.py" in c for c in cmdlines)  # server, its watch
        assert gone_within(children, 5) == [] and group(p.pid) == []
        assert "stopped by SIGTERM: stage freeze cancelled" in out and "Traceback" not in out
        assert status_of(rd)["freeze"] == "cancelled"
        flows, tasks = prefect_states(home, since)
        assert flows and set(flows.values()) == {"CANCELLED"}, flows  # the pipeline and the freeze subflow
        assert {n: s for n, s in tasks.items() if n.startswith("freeze-") and n != "freeze-0"} and \
            set(tasks.values()) == {"CANCELLED"}, tasks

        # 2. the rerun resumes (freeze runs to the end); SIGINT while rollout's main thread holds the
        # signals back: the watch thread ends the process after GRACE_S
        since = utc_now()
        p = start(cfg_path, rd, home, "task:rollout", "120:blocked", tmp_path / "2.log")
        rc, seconds, children, cmdlines = stop(p, signal.SIGINT)
        out = (tmp_path / "2.log").read_text()
        assert rc == 128 + signal.SIGINT and GRACE_S <= seconds < 10, (rc, seconds, out)
        assert "stopped by SIGINT after" in out and "stage rollout cancelled" in out and "Traceback" not in out
        assert gone_within(children, 5) == [] and group(p.pid) == []
        assert status_of(rd) == {"freeze": "done", "rollout": "cancelled", "train": "missing", "evaluate": "missing",
                                 "analyze": "missing"}
        flows, tasks = prefect_states(home, since)
        assert [s for n, s in flows.items() if n.startswith("freeze")] == ["COMPLETED"], flows
        assert {s for n, s in flows.items() if not n.startswith("freeze")} == {"CANCELLED"}, flows
        assert [s for n, s in tasks.items() if n.startswith("rollout-") and n != "rollout-0"] == ["CANCELLED"], tasks

        # 3. SIGKILL of the run alone: nothing can answer it, but its server does not outlive it
        p = start(cfg_path, rd, home, "task:rollout", "120", tmp_path / "3.log")
        assert "Task run 'freeze-" in (tmp_path / "3.log").read_text() and "Cached" in (tmp_path / "3.log").read_text()
        rc, seconds, children, cmdlines = stop(p, signal.SIGKILL)
        assert rc == -signal.SIGKILL and sum("uvicorn" in c for c in cmdlines) == 1
        assert gone_within(children, 8) == [], cmdlines
        assert status_of(rd)["rollout"] == "interrupted"  # its record says Running, its process is gone
    finally:
        for q in group(p.pid):
            q.kill()
