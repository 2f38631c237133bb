"""The leakage guard: test-split tasks never reach training, and the evaluation refuses a run where
they did. Checked by task hash against the frozen ``tasks`` artifact, never by a row's own split
label. Below the train and evaluate stages, which both call it."""

from __future__ import annotations

from typing import Any


class LeakageError(RuntimeError):
    """Test-split data reached a stage that must never see it; the message lists the tasks."""


def check_train_rollouts(tasks: list[dict[str, Any]], episodes: list[dict[str, Any]]) -> None:
    """Refuse training rollouts that hold a test-split task (the train stage's guard).

    Args:
        tasks: rows of the frozen ``tasks`` artifact (``task_id``, ``task_hash``, ``split``).
        episodes: rows of the ``episodes`` artifact (``task_hash``).

    Raises:
        LeakageError: naming how many test-split tasks leaked and (up to 10 of) their ids, sorted.
    """
    test_hashes = {t["task_hash"]: t["task_id"] for t in tasks if t["split"] == "test"}
    leaked = sorted({test_hashes[e["task_hash"]] for e in episodes if e["task_hash"] in test_hashes})
    if leaked:
        raise LeakageError(f"train: {len(leaked)} test-split task(s) in the training rollouts: {leaked[:10]}")


def check_leakage(tasks: list[dict[str, Any]], records: list[dict[str, Any]], episodes: list[dict[str, Any]]) -> None:
    """Refuse when a test-split task hash appears in the training rollouts or in the train-split
    records.

    Raises:
        LeakageError: listing (up to 10 of) the leaked task ids and where they were found.
    """
    test_hashes = {t["task_hash"]: t["task_id"] for t in tasks if t["split"] == "test"}
    where = {
        "the training rollouts": sorted({test_hashes[e["task_hash"]] for e in episodes if e["task_hash"] in test_hashes}),
        "the train records": sorted({test_hashes[r["task_hash"]] for r in records
                                     if r["split"] == "train" and r["task_hash"] in test_hashes}),
    }
    found = {k: v for k, v in where.items() if v}
    if found:
        n = len(set().union(*found.values()))
        raise LeakageError(f"evaluate: {n} test-split task(s) appear in "
                           + "; ".join(f"{k}: {v[:10]}" for k, v in found.items()))
