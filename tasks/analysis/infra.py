"""Infra errors per stage, counted from a run's artifacts: what the run summary, the report and every
findings row carry, and the findings threshold that refuses to publish a run above it.

An infra error is an attempt the infrastructure lost (the sandbox did not start, the exec server
died), not a graded failure. Three stages can lose one:

- ``rollout``: the training rollouts, ``rollout/episodes`` rows with ``status == "infra_error"``;
  denominator: the episodes the stage wrote (every planned episode has a row, lost or not). These
  are never retried: the train stage drops them (``dropped {'infra_error': n}`` in
  ``train/train_steps``).
- ``train``: the episodes online training sampled itself (``train/online_episodes``), same rule;
  denominator: the episodes it sampled (0 for a run whose arms all train on the frozen rollouts).
  ``dropped``: per training arm, the episodes left out of its batches by rule (the ``dropped`` JSON
  of its ``train/train_steps`` rows: one pass of a frozen arm, every iteration of an online arm).
- ``evaluate``: the sealed evaluation's planned attempts whose final outcome is still
  ``infra_error`` after ``evaluate.infra_retries`` retries (``evaluate/eval_cells``, counted there
  by :func:`tasks.evaluate.stats.cell_table`); ``infra_attempts``: every sealed row that ended in
  ``infra_error``, retried or not, and ``retries``: the retry rows.

A stage whose artifact the run does not have (not run yet, or another kind of run) is left out.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from schemas import ArtifactStore

INFRA_STAGES = ("rollout", "train", "evaluate")
# what a stage's denominator counts, for one-line messages and the report
UNITS = {"rollout": "episodes", "train": "sampled episodes", "evaluate": "planned attempts"}
# the findings threshold when a config's evaluate.max_infra_error_fraction is unset (docs/experiments/findings-rules.md)
DEFAULT_MAX_INFRA_ERROR_FRACTION = 0.0


class InfraThresholdError(ValueError):
    """A run whose infra errors in some stage exceed the findings threshold; the message is one
    line naming the stage, the count and the threshold."""


def _status_counts(store: ArtifactStore, stage: str, name: str) -> dict[str, int]:
    """``{"planned": rows, "infra_errors": rows with status infra_error}`` of an episodes artifact
    (only the ``status`` column is decoded; the file's SHA-256 is checked against its manifest)."""
    table = store.read((stage, name), contract="episodes").select(["status"])
    status = table.column("status").to_pylist()
    return {"planned": len(status), "infra_errors": sum(s == "infra_error" for s in status)}


def train_dropped(steps: list[dict[str, Any]], online_arms: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per training arm, the episodes left out of its batches by rule (``{rule: episodes}``, rules
    with zero left out omitted), from ``train_steps`` rows (``arm``, ``epoch``, ``dropped``: JSON).

    Every step of a batch carries the batch's ``dropped``: one row per (arm, epoch) counts. A
    frozen arm trains every epoch on the same rollouts, so its first epoch's counts are the arm's;
    an online arm (named in ``online_arms``) samples a fresh batch each iteration (``epoch``), so
    its counts are summed over iterations.

    Raises:
        ValueError: a ``dropped`` value that is not a JSON object of integers (naming the arm and step).
    """
    online = set(online_arms)
    per: dict[str, dict[int, dict[str, int]]] = {}
    for s in steps:
        arm = s.get("arm") or "final"
        raw = s.get("dropped") or "{}"
        try:
            d = json.loads(raw)
            if not isinstance(d, dict) or not all(isinstance(v, int) for v in d.values()):
                raise ValueError
        except ValueError:
            raise ValueError(f"train_steps arm {arm!r} step {s.get('step')}: dropped={raw!r} is not a JSON object "
                             "of episode counts") from None
        per.setdefault(arm, {}).setdefault(int(s["epoch"]), d)
    out: dict[str, dict[str, int]] = {}
    for arm, by_epoch in per.items():
        epochs = sorted(by_epoch)
        use = [by_epoch[e] for e in epochs] if arm in online else [by_epoch[epochs[0]]]
        total: dict[str, int] = {}
        for d in use:
            for rule, n in d.items():
                total[rule] = total.get(rule, 0) + n
        out[arm] = {k: v for k, v in sorted(total.items()) if v}
    return out


def infra_counts(store: ArtifactStore, online_arms: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Infra errors per stage of a run, from its artifacts (see the module docstring).

    Args:
        store: the run folder.
        online_arms: the training arms that sample online (``train.mode`` not ``frozen``; without
            ``arms``: ``final`` when the run trains online), for :func:`train_dropped`.

    Returns:
        ``{stage: counts}`` in :data:`INFRA_STAGES` order, for the stages the run has:
        ``rollout``: ``planned``, ``infra_errors`` (ints);
        ``train``: ``planned``, ``infra_errors`` (ints), ``dropped`` (``{arm: {rule: episodes}}``);
        ``evaluate``: ``planned``, ``infra_errors`` (final attempts), ``infra_attempts``,
        ``retries`` (ints).

    Raises:
        ArtifactError: an artifact differs from its manifest (SHA-256) or its contract.
    """
    out: dict[str, dict[str, Any]] = {}
    if store.exists("rollout/episodes.manifest.json"):
        out["rollout"] = _status_counts(store, "rollout", "episodes")
    if store.exists("train/train_steps.manifest.json"):
        sampled = _status_counts(store, "train", "online_episodes") \
            if store.exists("train/online_episodes.manifest.json") else {"planned": 0, "infra_errors": 0}
        out["train"] = {**sampled, "dropped": train_dropped(store.rows(("train", "train_steps")), online_arms)}
    if store.exists("evaluate/eval_cells.manifest.json"):
        cells = [c for c in store.rows(("evaluate", "eval_cells")) if c["kind"] == "cell"]
        ev = {"planned": sum(c["planned"] for c in cells), "infra_errors": sum(c["infra_errors"] for c in cells),
              "infra_attempts": 0, "retries": 0}
        if store.exists("evaluate/evaluations.manifest.json"):
            t = store.read(("evaluate", "evaluations")).select(["status", "retry"]).to_pylist()
            ev["infra_attempts"] = sum(r["status"] == "infra_error" for r in t)
            ev["retries"] = sum(r["retry"] > 0 for r in t)
        out["evaluate"] = ev
    return out


def online_arm_names(cfg: Any) -> list[str]:
    """The arms of a :class:`~tasks.config.RunConfig` that sample online (``train.mode`` other
    than ``frozen``), by the names their ``train_steps`` rows carry."""
    return [name for name, tc in cfg.arm_configs() if tc.mode != "frozen"]


def row_fields(counts: dict[str, dict[str, Any]], max_fraction: float) -> dict[str, Any]:
    """What a findings row carries of :func:`infra_counts`: ``infra_errors`` (``{stage: n}``),
    ``infra_planned`` (``{stage: denominator}``), ``infra_total`` (the sum over stages) and
    ``infra_threshold`` (the findings threshold, a fraction of each stage's denominator)."""
    return {"infra_errors": {s: c["infra_errors"] for s, c in counts.items()},
            "infra_planned": {s: c["planned"] for s, c in counts.items()},
            "infra_total": sum(c["infra_errors"] for c in counts.values()),
            "infra_threshold": max_fraction}


def allowed(planned: int, max_fraction: float) -> int:
    """The most infra errors a stage of ``planned`` attempts may have under the threshold:
    ``floor(max_fraction * planned)`` (0 when ``max_fraction`` is 0)."""
    return int(math.floor(max_fraction * planned + 1e-9))


def check_threshold(counts: dict[str, dict[str, Any]], max_fraction: float) -> None:
    """Refuse a run whose infra errors in any stage exceed ``max_fraction`` of that stage's
    denominator (:func:`allowed`); stages are checked in :data:`INFRA_STAGES` order.

    Raises:
        InfraThresholdError: one line naming the first stage above the threshold, its count, its
            denominator and the threshold.
        ValueError: ``max_fraction`` outside [0, 1].
    """
    if not (0.0 <= max_fraction <= 1.0):
        raise ValueError(f"evaluate.max_infra_error_fraction={max_fraction!r} is not in [0, 1]")
    for stage in INFRA_STAGES:
        c = counts.get(stage)
        if c is None:
            continue
        limit = allowed(c["planned"], max_fraction)
        if c["infra_errors"] > limit:
            raise InfraThresholdError(
                f"{stage}: {c['infra_errors']} infra error(s) of {c['planned']} {UNITS[stage]}, above the findings "
                f"threshold of {limit} (evaluate.max_infra_error_fraction = {max_fraction:g}); fix the cause and rerun "
                f"from that stage (harnessrl run --from {stage})")


def threshold_of(plan: dict[str, Any]) -> float:
    """The findings threshold a sealed evaluation plan fixes: its ``max_infra_error_fraction``,
    or :data:`DEFAULT_MAX_INFRA_ERROR_FRACTION` for a plan of a config that leaves it unset."""
    v = plan.get("max_infra_error_fraction")
    return DEFAULT_MAX_INFRA_ERROR_FRACTION if v is None else float(v)
