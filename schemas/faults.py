"""Fault injection for crash tests (a test hook, not a feature): ``HARNESSRL_FAULT=<point>`` makes
the process SIGKILL itself when it reaches ``<point>``, as a power cut or an OOM kill would.

Points (``STAGE`` one of freeze, rollout, train, evaluate, analyze; ``REL`` a store path such as
``rollout/episodes.parquet``):

==========================  ===============================================================
``before:STAGE``            between stages: the previous stage finished, STAGE not started
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

Unset (the default) every point is a no-op costing one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "HARNESSRL_FAULT"
ONCE_ENV = "HARNESSRL_FAULT_ONCE"


def fault_point(point: str) -> None:
    """SIGKILL this process when ``$HARNESSRL_FAULT`` equals ``point`` (and, with
    ``$HARNESSRL_FAULT_ONCE``, no process did before; see the module docstring). Returns normally
    otherwise."""
    if os.environ.get(ENV) != point:
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
