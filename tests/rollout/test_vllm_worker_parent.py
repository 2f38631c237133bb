"""The vLLM worker ends, with the processes it started, when the process that started it is killed
(tasks.rollout.engines.vllm_worker.exit_with_parent); no vLLM needed: a stand-in worker loads the
worker module by path, as the engine runs it, and starts a child in its group as vLLM would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "tasks" / "rollout" / "engines" / "vllm_worker.py"


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped) or a missing process is not alive."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _stand_in(watch: bool) -> str:
    return (
        "import importlib.util, os, subprocess, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('vllm_worker', {str(WORKER)!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        + ("w.exit_with_parent(os.getppid(), 0.05)\n" if watch else "")
        + "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")


def _spawn(watch: bool) -> tuple[subprocess.Popen, int, int]:
    """A parent that starts the stand-in worker in a session of its own (as VLLMPolicy does):
    ``(parent, worker pid, the worker's child pid)``."""
    parent_code = (
        "import subprocess, sys, time\n"
        f"w = subprocess.Popen([sys.executable, '-c', {_stand_in(watch)!r}], stdout=subprocess.PIPE, text=True, "
        "start_new_session=True)\n"
        "print(w.pid, w.stdout.readline().strip(), flush=True)\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    worker, child = map(int, parent.stdout.readline().split())
    return parent, worker, child


def _gone_within(pids: list[int], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_the_worker_and_its_group_end_when_the_parent_is_killed():
    parent, worker, child = _spawn(watch=True)
    try:
        assert _alive(worker) and _alive(child)
        parent.kill()
        parent.wait()
        assert _gone_within([worker, child], 10.0)
    finally:
        for p in (worker, child):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_without_the_watch_the_worker_outlives_its_parent():
    """The case the watch exists for: a worker in its own session survives a kill of its parent."""
    parent, worker, child = _spawn(watch=False)
    try:
        parent.kill()
        parent.wait()
        assert not _gone_within([worker, child], 1.0)
    finally:
        try:
            os.killpg(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_stop_by_signal_kills_a_busy_worker_at_once(tmp_path, monkeypatch):
    """Leaving ``with VLLMPolicy(...)`` by a stop (Prefect's TerminationSignal: a BaseException)
    kills the worker's group at once; a worker in the middle of a batch reads no request, so the
    polite shutdown of an ordinary exit would wait ``close``'s 30 s for it."""
    from prefect.exceptions import TerminationSignal

    from tasks.rollout.engines import vllm_engine

    busy = tmp_path / "busy_worker.py"  # answers "started", then computes without reading its input
    busy.write_text("import json, subprocess, sys, time\n"
                    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "print(json.dumps({'ok': True, 'child': child.pid}), flush=True)\n"
                    "time.sleep(60)\n")
    monkeypatch.setattr(vllm_engine, "WORKER", busy)
    worker = vllm_engine._Worker(Path(sys.executable), {}, dict(os.environ), start_timeout_s=30)
    policy = object.__new__(vllm_engine.VLLMPolicy)
    policy._worker, policy._merged_dir = worker, None
    pids = [worker.proc.pid, worker.ready["child"]]
    t0 = time.monotonic()
    try:
        policy.__exit__(TerminationSignal, TerminationSignal(signal.SIGTERM), None)
        assert time.monotonic() - t0 < 5 and _gone_within(pids, 2.0)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
