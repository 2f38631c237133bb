"""Learning curves from the sealed evaluation: held-out pass@1 against the training step.

Each training arm's evaluated checkpoints are the base policy (step 0), its snapshots
``<arm>-step<n>`` (``train.save_every``) and its final adapter; every one is sealed like the rest,
so a curve point is a sealed statistic, not a training-time estimate. Beside it, the mean training
reward of the optimizer steps since the previous point (what the trainer saw on its own samples).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tasks.analysis.ceiling import task_outcomes


def checkpoint_arms(checkpoints: list[dict[str, Any]], arms: list[str]) -> dict[str, tuple[str, int]]:
    """checkpoint name -> (arm, training step) for the trained checkpoints: an arm's final adapter
    (its own name) and its snapshots ``<arm>-step<n>``; ``base`` is step 0 of every arm and is not
    in the map."""
    out = {}
    for c in checkpoints:
        if c["name"] in arms:
            out[c["name"]] = (c["name"], int(c["step"]))
            continue
        m = re.fullmatch(r"(.+)-step(\d+)", c["name"])
        if m and m.group(1) in arms:
            out[c["name"]] = (m.group(1), int(m.group(2)))
    return out


def learning_curve(evaluations: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
                   train_steps: list[dict[str, Any]], arms: list[str], *, resamples: int, seed: int,
                   level: float = 0.95, base: str = "base") -> list[dict[str, Any]]:
    """Rows ``arm, checkpoint, step, harness_name, n_tasks, pass_at_1, ci_low, ci_high,
    train_reward``, per arm sorted by (harness, step).

    pass@1 is the sealed cell's (mean over tasks of each task's resolved fraction of graded
    attempts); the interval a percentile bootstrap at ``level`` over tasks (``resamples`` draws,
    numpy Generator seeded with ``seed``), the same estimator as ``suite_pass_rates``.
    ``train_reward``: mean of ``reward_mean`` over the arm's optimizer steps in (previous point's
    step, this step]; None at step 0 and when the arm logged no step there.

    Raises:
        ValueError: ``resamples`` < 1 or ``level`` outside (0, 1).
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    owner = checkpoint_arms(checkpoints, arms)
    outcomes = task_outcomes(evaluations)
    rng = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    rows = []
    for arm in arms:
        points = [(base, 0)] + sorted(((ck, st) for ck, (a, st) in owner.items() if a == arm), key=lambda p: p[1])
        steps = sorted((s for s in train_steps if (s.get("arm") or "final") == arm), key=lambda s: s["step"])
        # the harnesses the arm's own checkpoints were evaluated under (base alone is no curve)
        harnesses = sorted({h for (ck, h) in outcomes if ck in dict(points) and ck != base})
        for h in harnesses:
            prev = 0
            for ck, st in points:
                tasks = outcomes.get((ck, h))
                if tasks is None:
                    continue
                rates = np.asarray([c / n for n, c, _i in tasks.values() if n], dtype=np.float64)
                window = [s["reward_mean"] for s in steps if prev < s["step"] <= st]
                row: dict[str, Any] = {"arm": arm, "checkpoint": ck, "step": st, "harness_name": h,
                                       "n_tasks": len(tasks), "pass_at_1": None, "ci_low": None, "ci_high": None,
                                       "train_reward": float(np.mean(window)) if window else None}
                if rates.size:
                    boot = rates[rng.integers(0, rates.size, size=(resamples, rates.size))].mean(axis=1)
                    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
                    row.update(pass_at_1=float(rates.mean()), ci_low=float(lo), ci_high=float(hi))
                rows.append(row)
                prev = st
    return rows
