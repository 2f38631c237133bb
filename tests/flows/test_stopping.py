"""``flows.stopping.stop_on_signals`` on its own (no Prefect server, seconds): a SIGTERM or SIGINT
unwinds the body and exits 128 + signal with one line and the running stage's record Cancelled;
with the signals held back in the main thread (as in a long native call) the watch thread does the
same after the grace period. The whole path through a real ``harnessrl run`` is
``tests/flows/test_ops_stop.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BODY = """
import json, sys, time
from flows.stopping import note_stage, stop_on_signals
from schemas import ArtifactStore
from schemas.faults import _hold
run, hold = sys.argv[1], sys.argv[2]
record = {"stage": "rollout", "state": "Running", "started_at": "2026-01-01T00:00:00+00:00"}
ArtifactStore(run).write_json(".harnessrl/rollout.json", record)
with stop_on_signals("test run", grace_s=1.0):
    note_stage(ArtifactStore(run).url, "rollout", record)
    _hold("test", hold)
    print("not stopped", flush=True)
"""


def run_and_signal(tmp_path: Path, sig: int, hold: str) -> tuple[int, float, str, dict]:
    env = {**os.environ}
    env.pop("PREFECT_API_URL", None)
    p = subprocess.Popen([sys.executable, "-c", BODY, str(tmp_path / "run"), hold], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        line = ""
        while "fault-hold" not in line:
            line = p.stderr.readline()
            assert line or p.poll() is None, p.stderr.read()
            assert time.monotonic() < end
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, seconds, out + err, json.loads((tmp_path / "run/.harnessrl/rollout.json").read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_unwinds_the_body_and_cancels_the_stage(tmp_path, sig):
    rc, seconds, out, record = run_and_signal(tmp_path, sig, "60")
    name = signal.Signals(sig).name
    assert rc == 128 + sig and seconds < 5.0, (rc, seconds, out)
    # the main thread's own stop (the watch thread only ends the interpreter's exit if it takes > 1 s)
    assert f"test run stopped by {name}: stage rollout cancelled" in out and "Traceback" not in out
    assert "busy in native code" not in out
    assert "not stopped" not in out
    assert record["state"] == "Cancelled" and record["error"].startswith(f"stopped by {name}")
    assert record["finished_at"] and record["seconds"] > 0


def test_a_main_thread_that_holds_the_signal_back_is_ended_by_the_watch(tmp_path):
    # the fault blocks SIGTERM in the main thread only; now and then (3 of ~17 runs seen) the kernel
    # hands the signal to another thread of the process first and the main thread stops on its own,
    # in well under a second: also a clean stop, but not the path under test. Up to 3 tries for the
    # watch's path; every try must be one of the two clean stops.
    for attempt in range(3):
        rc, seconds, out, record = run_and_signal(tmp_path / str(attempt), signal.SIGTERM, "60:blocked")
        assert rc == 128 + signal.SIGTERM and seconds < 5.0, (rc, seconds, out)
        assert record["state"] == "Cancelled" and record["error"].startswith("stopped by SIGTERM")
        if seconds >= 1.0:
            break
        assert "test run stopped by SIGTERM: stage rollout cancelled" in out, out
    assert 1.0 <= seconds, (seconds, out)
    assert "test run stopped by SIGTERM after 1 s (the main thread was busy in native code); stage rollout " \
           "cancelled" in out


def test_without_a_signal_the_body_runs_and_the_handlers_come_back():
    from flows.stopping import stop_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signals("test", grace_s=0.1):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was given back too


PARENT = """
import subprocess, sys, time
from flows.server import end_with_this_process
a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
end_with_this_process(a.pid)
print(a.pid, b.pid, flush=True)
time.sleep(60)
"""


def test_what_the_run_hands_the_reaper_ends_when_the_run_is_killed():
    """``flows.server.end_with_this_process``: a SIGKILL of the process that started them ends the
    processes it named (Prefect's temporary server in a run), and only those."""
    import psutil

    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    named, other = (psutil.Process(int(x)) for x in parent.stdout.readline().split())
    try:
        reaper = [c for c in psutil.Process(parent.pid).children() if "reaper.py" in " ".join(c.cmdline())]
        assert len(reaper) == 1
        parent.kill()
        parent.wait()
        gone, alive = psutil.wait_procs([named, reaper[0]], timeout=5)
        assert alive == []
        assert other.is_running() and other.status() != psutil.STATUS_ZOMBIE  # not named: left alone
    finally:
        for p in (named, other):
            try:
                p.kill()
            except psutil.Error:
                pass


def test_the_reaper_leaves_a_reused_pid_alone():
    import psutil

    from flows.reaper import reap

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        created = psutil.Process(p.pid).create_time()
        assert reap({p.pid: created - 5.0}, wait_s=0.5) == [] and p.poll() is None  # another process's pid
        assert reap({p.pid: created}, wait_s=2.0) == [p.pid]
        assert p.wait(timeout=5) is not None  # ended (psutil reaped it: the status is its to keep)
    finally:
        if p.poll() is None:
            p.kill()
