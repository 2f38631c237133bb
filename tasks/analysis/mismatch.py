"""P1 (ceiling minus mismatch, METHODS.md) at its simplest estimator, per (checkpoint, harness):

- harness ceiling C_h = mean over tasks of pass@K (unbiased estimator, Chen et al. 2021);
- deployed return J = pass@1;
- mismatch M = C_h - J.

Attempts with status ``infra_error`` are left out of every denominator (P4's rule); ``timeout``
counts as a graded failure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tasks.evaluate.stats import mean, pass_at_k


def mismatch_table(evaluations: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Rows of the ``mismatch`` artifact, sorted by (checkpoint, harness).

    A task with fewer than ``k`` graded attempts is left out of the ceiling (pass@K is undefined
    for it) but counts in pass@1. Raises ValueError for ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    cells: dict[tuple[str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    infra: dict[tuple[str, str], int] = defaultdict(int)
    for r in evaluations:
        key = (r["checkpoint"], r["harness_name"])
        if r["status"] == "infra_error":
            infra[key] += 1
            cells[key]  # noqa: B018 - make the cell exist
            continue
        cells[key][r["task_id"]].append(bool(r["resolved"]))
    rows = []
    for (ck, h) in sorted(cells):
        per_task = cells[(ck, h)]
        p1 = [sum(v) / len(v) for v in per_task.values() if v]
        pk = [pass_at_k(len(v), sum(v), k) for v in per_task.values() if len(v) >= k]
        pass1 = mean(p1) if p1 else 0.0
        ceiling = mean(pk) if pk else pass1
        rows.append({
            "checkpoint": ck, "harness_name": h, "n_tasks": len(per_task),
            "attempts": max((len(v) for v in per_task.values()), default=0),
            "graded": sum(len(v) for v in per_task.values()), "infra_errors": infra[(ck, h)],
            "pass_at_1": pass1, "ceiling_k": k, "ceiling": ceiling, "mismatch": max(0.0, ceiling - pass1),
        })
    return rows
