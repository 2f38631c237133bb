"""A watch process that ends what a run started when the run itself is gone, even by SIGKILL.

``python flows/reaper.py FD``: read lines ``<pid> <create time>`` from the pipe ``FD`` (the run
holds its only write end, which no other child inherits); when the pipe reaches end-of-file (the
run exited, however it died) send SIGTERM to each listed process that is still the same process
(same creation time: a reused pid is left alone), and SIGKILL to any still there 3 s later.
SIGINT and SIGTERM are ignored so that a signal to the run's whole process group does not end the
watch before the run is gone.

Used for Prefect's temporary server (:func:`flows.server.end_with_this_process`), which Prefect
starts with a plain ``subprocess.Popen`` that outlives a killed parent. The engine worker watches
its parent itself (``tasks.rollout.engines.vllm_worker.exit_with_parent``); Prefect's server
runs Prefect's code, so the watch is a process beside it. Standard library and psutil only: it
starts in ~0.1 s.
"""

from __future__ import annotations

import os
import signal
import sys


def reap(watched: dict[int, float], wait_s: float = 3.0) -> list[int]:
    """SIGTERM every process of ``watched`` (pid -> create time) still alive as the same process,
    SIGKILL those left after ``wait_s``. Returns the pids signalled."""
    import psutil

    procs = []
    for pid, created in watched.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) > 0.01:
                continue
            p.terminate()
            procs.append(p)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in procs]


def main(fd: int) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    watched: dict[int, float] = {}
    buf = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            pid, created = line.split()
            watched[int(pid)] = float(created)
    reap(watched)


if __name__ == "__main__":
    main(int(sys.argv[1]))
