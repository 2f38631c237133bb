"""Fault injection for crash tests (a test hook, not a feature): ``HARNESSRL_FAULT=<point>`` makes
the process SIGKILL itself when it reaches ``<point>``, as a power cut or an OOM kill would.

Points (``STAGE`` one of freeze, rollout, train, evaluate, analyze; ``REL`` a store path such as
``rollout/episodes.parquet``):

==========================  ===============================================================
``before:STAGE``            between stages: the previous stage finished, STAGE not started
``task:STAGE``              inside STAGE's Prefect task run, before the stage's function
``after:STAGE``             STAGE's task finished and its result is persisted; next not started
``tmp-written:REL``         inside a stage: REL's bytes are in the temp file, not yet renamed
``renamed:REL``             inside a stage: REL renamed into place, its manifest not yet written
``manifest:STAGE/NAME``     inside a stage: artifact NAME complete (Parquet + manifest), the
                            stage's other artifacts not yet written
``rollout:HARNESS:turn:T``  inside a rollout shard (any process: a Dask or Ray worker too), turn
                            T of harness HARNESS sampled, its tool calls not yet run
==========================  ===============================================================

With ``HARNESSRL_FAULT_ONCE=<path>`` as well, only the first process to reach the point dies: it
creates ``<path>`` (exclusively; it holds ``<pid> <point>``) just before; a process that finds the
file there goes on (a killed worker's shard rerun elsewhere then runs to the end).

With ``HARNESSRL_FAULT_HOLD=<seconds>`` the process does not die at the point: it holds there
that long (a stage that takes time, for stop tests), in ``time.sleep``, which a signal handler
interrupts; ``<seconds>:blocked`` holds with SIGTERM and SIGINT blocked in the holding thread, as
a long native call (a training step) would hold Python's handlers back. Either way it writes
``fault-hold <point> <pid>`` to stderr first, then goes on.

Unset (the default) every point is a no-op costing one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "HARNESSRL_FAULT"
ONCE_ENV = "HARNESSRL_FAULT_ONCE"
HOLD_ENV = "HARNESSRL_FAULT_HOLD"


def fault_point(point: str) -> None:
    """SIGKILL this process when ``$HARNESSRL_FAULT`` equals ``point`` (and, with
    ``$HARNESSRL_FAULT_ONCE``, no process did before), or hold it there with
    ``$HARNESSRL_FAULT_HOLD`` (see the module docstring). Returns normally otherwise.

    Raises:
        ValueError: ``$HARNESSRL_FAULT_HOLD`` is not ``<seconds>`` or ``<seconds>:blocked``.
    """
    if os.environ.get(ENV) != point:
        return
    hold = os.environ.get(HOLD_ENV)
    if hold:
        _hold(point, hold)
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()} {point}\n".encode())
        os.fsync(fd)
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _say_holding(point: str) -> None:
    import sys

    sys.stderr.write(f"fault-hold {point} {os.getpid()}\n")
    sys.stderr.flush()


def _hold(point: str, spec: str) -> None:
    import time

    seconds, _, how = spec.partition(":")
    try:
        secs = float(seconds)
    except ValueError:
        secs = -1.0
    if secs < 0 or how not in ("", "blocked"):
        raise ValueError(f"{HOLD_ENV}={spec!r}: expected <seconds> or <seconds>:blocked")
    if how != "blocked":
        _say_holding(point)
        time.sleep(secs)
        return
    stops = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        _say_holding(point)  # only once blocked: a signal sent on this line must find them held back
        end = time.monotonic() + secs
        while time.monotonic() < end:
            time.sleep(max(end - time.monotonic(), 0.0))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
