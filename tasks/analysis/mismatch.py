"""P1 (ceiling minus mismatch, METHODS.md) at its simplest estimator: a thin wrapper kept for the
analyze stage's ``mismatch`` artifact (contract v1). The computation lives in
:func:`tasks.analysis.ceiling.mismatch_cells`."""

from __future__ import annotations

from typing import Any

from tasks.analysis.ceiling import mismatch_cells

_V1_COLUMNS = ("checkpoint", "harness_name", "n_tasks", "attempts", "graded", "infra_errors", "pass_at_1",
               "ceiling_k", "ceiling", "mismatch")


def mismatch_table(evaluations: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Rows of the ``mismatch`` artifact (contract v1 columns), sorted by (checkpoint, harness):
    :func:`tasks.analysis.ceiling.mismatch_cells` with ``beta=None``, projected to
    ``checkpoint, harness_name, n_tasks, attempts, graded, infra_errors, pass_at_1, ceiling_k,
    ceiling, mismatch``. Unlike the earlier version, retried infra errors count once (final
    attempts), ``ceiling`` is None (not pass@1) when no task has k graded attempts, ``pass_at_1`` is
    None when nothing was graded, and ``mismatch`` is not clamped at 0.

    Raises:
        ValueError: see :func:`~tasks.analysis.ceiling.mismatch_cells`.
    """
    return [{c: r[c] for c in _V1_COLUMNS} for r in mismatch_cells(evaluations, k=k, beta=None)]
