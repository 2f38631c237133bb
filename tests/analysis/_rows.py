"""Builders of evaluation rows for the analysis tests."""

from __future__ import annotations

from typing import Any


def ev(checkpoint: str, harness: str, task: str, attempt: int, status: str, retry: int = 0) -> dict[str, Any]:
    """One sealed-evaluation row with the columns the analysis reads."""
    resolved = status == "resolved"
    return {"checkpoint": checkpoint, "harness_name": harness, "record_id": f"{task}|{harness}", "task_id": task,
            "attempt": attempt, "retry": retry, "status": status, "resolved": resolved,
            "reward": 1.0 if resolved else 0.0, "answer_parsed": True}


def outcomes(checkpoint: str, harness: str, task: str, statuses: list[str]) -> list[dict[str, Any]]:
    """One row per attempt, attempt = position in ``statuses``, retry 0."""
    return [ev(checkpoint, harness, task, a, s) for a, s in enumerate(statuses)]


def counts(checkpoint: str, harness: str, task: str, n: int, c: int) -> list[dict[str, Any]]:
    """``n`` graded attempts of which the first ``c`` resolved."""
    return outcomes(checkpoint, harness, task, ["resolved"] * c + ["unresolved"] * (n - c))
