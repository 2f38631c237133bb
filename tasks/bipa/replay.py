"""Acceptance rule and acceptance-rule replay of P2 (docs/methods/p2-bipa.md).

A skill optimizer accepts a candidate when its selection score beats the incumbent's by the
rule (:class:`AcceptRule`). Replay re-scores the same candidates on fresh episodes and held-out
tasks, applies the same rule to each score set, and measures the *selection effect*
(winner's curse): E[selection score - replay score | accepted at selection].

Scores are per-task mean rewards in [0, 1]; a set's score is the mean of its per-task scores,
computed with :func:`math.fsum` so it does not depend on the order of the tasks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


TIE_TOL = 1e-12


class AcceptRule(BaseModel):
    """Accept a candidate iff ``candidate_mean - incumbent_mean > better_by`` (strict).

    ``better_by`` = 0 (the default) is "strictly better; ties rejected"; ``better_by: 0.05``
    asks for a margin of more than 0.05 reward. A difference within ``TIE_TOL`` (1e-12) of the
    margin is a tie (means such as 0.55 - 0.5 are not exact in binary floating point).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    better_by: float = Field(default=0.0, ge=0.0, lt=1.0)

    def accepts(self, candidate_mean: float, incumbent_mean: float) -> bool:
        """The rule on two set means (floats in [0, 1]).

        Raises:
            ValueError: a mean that is NaN or outside [0, 1] (names which).
        """
        for name, v in (("candidate_mean", candidate_mean), ("incumbent_mean", incumbent_mean)):
            if not (0.0 <= v <= 1.0):
                raise ValueError(f"AcceptRule: {name}={v!r} is not a mean reward in [0, 1]")
        return candidate_mean - incumbent_mean > self.better_by + TIE_TOL


def set_mean(scores: dict[str, float]) -> float:
    """Mean of per-task scores ``{task_id: mean reward}`` (fsum; order-free).

    Raises:
        ValueError: ``scores`` is empty.
    """
    if not scores:
        raise ValueError("set_mean: no task scores")
    return math.fsum(scores.values()) / len(scores)


def selection_effect(selection: list[dict[str, float]], replay: list[dict[str, float]], *, paired: bool,
                     bootstrap: int, seed: int, level: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Selection effect of the accepted candidates with a task-resampling bootstrap interval.

    Args:
        selection: per accepted candidate, its selection per-task scores ``{task_id: score}``.
        replay: per accepted candidate (same order), its per-task scores on the replay set.
        paired: True when the replay set has the same tasks as the selection set (fresh seeds):
            one resample of task ids serves both; False (held-out tasks): the two task sets are
            resampled independently.
        bootstrap: number of resamples B (0: no interval); ``seed``: numpy ``default_rng`` seed.
        level: two-sided percentile interval level.

    Returns:
        ``(effect, low, high)``: effect = mean over candidates of (set_mean(selection_c) -
        set_mean(replay_c)); the interval is the (1-level)/2 and (1+level)/2 percentiles
        (``numpy.quantile``, linear) of the effect over B resamples of tasks with replacement
        (Efron & Tibshirani 1993, ch. 13). All None when there is no accepted candidate.

    Raises:
        ValueError: lists of different lengths, or paired sets with different task ids.
    """
    if len(selection) != len(replay):
        raise ValueError(f"selection_effect: {len(selection)} selection score sets but {len(replay)} replay sets")
    if not selection:
        return None, None, None
    effect = math.fsum(set_mean(s) - set_mean(r) for s, r in zip(selection, replay)) / len(selection)
    if bootstrap <= 0:
        return effect, None, None
    s_ids = sorted(selection[0])
    r_ids = sorted(replay[0])
    for s, r in zip(selection, replay):
        if sorted(s) != s_ids or sorted(r) != r_ids:
            raise ValueError("selection_effect: every candidate must be scored on the same tasks per set")
    if paired and s_ids != r_ids:
        raise ValueError(f"selection_effect: paired sets need the same tasks; selection has {s_ids[:3]}..., "
                         f"replay {r_ids[:3]}...")
    S = np.array([[s[t] for t in s_ids] for s in selection], dtype=np.float64)  # [C, n_sel]
    R = np.array([[r[t] for t in r_ids] for r in replay], dtype=np.float64)  # [C, n_rep]
    rng = np.random.default_rng(seed)
    i_s = rng.integers(0, S.shape[1], size=(bootstrap, S.shape[1]))  # [B, n_sel]
    i_r = i_s if paired else rng.integers(0, R.shape[1], size=(bootstrap, R.shape[1]))
    eff = (S[:, i_s].mean(axis=2) - R[:, i_r].mean(axis=2)).mean(axis=0)  # [B]
    lo, hi = np.quantile(eff, [(1 - level) / 2, (1 + level) / 2])
    return effect, float(lo), float(hi)


def replay_table(candidates: list[dict[str, Any]], scores: dict[str, dict[int, dict[str, float]]], rule: AcceptRule
                 ) -> list[dict[str, Any]]:
    """Rows of ``bipa_replay``: each scored candidate on each score set, with the rule re-applied.

    Args:
        candidates: ``bipa_candidates`` rows (``candidate_idx``, ``parent_idx``, ``decision``).
        scores: ``{score_set: {candidate_idx: {task_id: score}}}`` for sets selection/fresh/test.

    Returns:
        one row per (candidate with scores, set), ordered by candidate then set; ``parent_mean``
        and ``rule_accepts`` are None for the seed (it has no parent).

    Raises:
        KeyError: a scored candidate's parent has no scores on that set.
    """
    rows = []
    for c in candidates:
        i = c["candidate_idx"]
        for name, per in scores.items():
            if i not in per:
                continue
            m = set_mean(per[i])
            p = c["parent_idx"]
            pm = set_mean(per[p]) if p >= 0 else None
            rows.append({"candidate_idx": i, "parent_idx": p, "score_set": name, "scores": _json(per[i]), "mean": m,
                         "parent_mean": pm, "accepted_at_selection": c["decision"] == "accepted",
                         "rule_accepts": rule.accepts(m, pm) if pm is not None else None})
    return rows


def effect_rows(candidates: list[dict[str, Any]], scores: dict[str, dict[int, dict[str, float]]], rule: AcceptRule,
                *, bootstrap: int, seed: int) -> list[dict[str, Any]]:
    """Rows of ``bipa_effect`` for the sets ``fresh`` (paired with selection) and ``test``
    (independent tasks): accepted count, how many the rule accepts again on that set, the
    selection effect and its bootstrap interval (see :func:`selection_effect`)."""
    acc = [c for c in candidates if c["decision"] == "accepted"]
    rows = []
    for name, paired in (("fresh", True), ("test", False)):
        if name not in scores:
            continue
        per = scores[name]
        eff, lo, hi = selection_effect([scores["selection"][c["candidate_idx"]] for c in acc],
                                       [per[c["candidate_idx"]] for c in acc], paired=paired,
                                       bootstrap=bootstrap, seed=seed)
        still = sum(rule.accepts(set_mean(per[c["candidate_idx"]]), set_mean(per[c["parent_idx"]])) for c in acc)
        rows.append({"score_set": name, "n_accepted": len(acc), "still_accepted": int(still), "selection_effect": eff,
                     "ci_low": lo, "ci_high": hi, "bootstrap": bootstrap, "seed": seed})
    return rows


def _json(d: dict[str, float]) -> str:
    from tasks.hashing import canonical_json

    return canonical_json(dict(sorted(d.items())))
