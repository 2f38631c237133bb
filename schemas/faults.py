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
==========================  ===============================================================

Unset (the default) every point is a no-op costing one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "HARNESSRL_FAULT"


def fault_point(point: str) -> None:
    """SIGKILL this process when ``$HARNESSRL_FAULT`` equals ``point`` (see the module docstring).
    Returns normally otherwise."""
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
