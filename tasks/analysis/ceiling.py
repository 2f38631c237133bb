"""P1 (docs/methods/p1-ceiling-mismatch.md): the harness ceiling and the mismatch per
(checkpoint, harness) cell of a sealed evaluation.

- Harness ceiling C_h, two estimators: the mean over tasks of the unbiased pass@K (Chen et al.
  2021, arXiv 2107.03374, eq. 1; :func:`tasks.evaluate.stats.pass_at_k`), and the KL-soft ceiling
  of KL-regularised control for a binary reward, J(p) = p e^{1/beta} / (1 - p + p e^{1/beta})
  (:func:`kl_soft_ceiling`), applied PER TASK to the reference policy's pass rate p_x on task x
  under the harness and then averaged over tasks (:func:`kl_soft_ceiling_tasks`): the optimal
  KL-regularised policy reweights the reference's own mass on success task by task, so a task
  the reference never solves (p_x = 0) contributes 0, whatever the other tasks' rates. J is
  concave in p near 0 for small beta, so J of the mean rate over-states the mean of J: half the
  tasks at p = 0 and half at 0.6 give 0.5 J(0.6), not J(0.3).
- beta: ``analyze.kl_beta`` (the KL coefficient of P1's harness-as-reference control problem,
  docs/methods/p1-ceiling-mismatch.md, in reward units per nat); its default 1.0 is chosen for
  the ceiling (a unit reward is worth one nat of divergence from the harness's preferences, so the
  ceiling multiplies each task's odds of success by e), not copied from the trainer's
  ``train.kl.beta``: at the trainer's 0.05, e^{1/beta} ~ 5e8 and J is ~1 for every task with one
  success, which says nothing about a harness.
- Deployed return J(pi) = pass@1; simple mismatch estimator M = C_h - pass@1.

Evaluation rows are read with the sealed-evaluation rules of :mod:`tasks.evaluate.stats`: each
planned attempt counts once, by its final outcome (:func:`~tasks.evaluate.stats.final_attempts`:
the highest ``retry`` of an ``infra_error`` replaces it); a final ``infra_error`` is left out of
every denominator (reported apart); ``timeout`` counts as a graded failure.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from tasks.evaluate.stats import GRADED, attempts_by_cell_and_task, final_attempts, mean, pass_at_k

EVAL_COLUMNS = ("checkpoint", "harness_name", "record_id", "task_id", "attempt", "retry", "status")
_STATUSES = frozenset(GRADED) | {"infra_error"}


def _check_beta(beta: float) -> None:
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or math.isnan(beta) or beta < 0:
        raise ValueError(f"beta (the KL coefficient) must be a number >= 0, got {beta!r}")


def kl_soft_ceiling(p: float, beta: float) -> float:
    """The KL-soft ceiling of a binary-reward task (P1: docs/methods/p1-ceiling-mismatch.md):

        J = p e^{1/beta} / (1 - p + p e^{1/beta}) = sigmoid(logit(p) + 1/beta)

    i.e. the success probability of the optimal KL-regularised policy pi* proportional to
    pi_ref exp(r / beta) when pi_ref succeeds with probability ``p`` and the reward is 1 on success,
    0 otherwise. Computed in the logit form, which neither overflows nor loses precision for small
    ``beta`` or ``p`` near 0 or 1.

    Args:
        p: the reference policy's success probability (pass@1), a float in [0, 1].
        beta: the KL coefficient (reward units per nat), >= 0. ``beta = 0`` is the limit
            beta -> 0+: 1.0 if p > 0; ``beta = inf`` gives ``p``.

    Returns:
        J in [0, 1] (float). Limits: p = 0 -> 0.0 (no reference mass on success can be
        reweighted), p = 1 -> 1.0.

    Raises:
        ValueError: ``p`` not a number in [0, 1], or ``beta`` not a number >= 0 (the message
            names the value).
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 <= p <= 1.0):
        raise ValueError(f"p (the reference pass rate) must be a number in [0, 1], got {p!r}")
    _check_beta(beta)
    if p == 0.0:
        return 0.0
    if p == 1.0 or beta == 0.0:
        return 1.0
    x = math.log(p) - math.log1p(-p) + 1.0 / beta  # 1/beta may be inf: handled below
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def kl_soft_ceiling_array(p: np.ndarray, beta: float) -> np.ndarray:
    """:func:`kl_soft_ceiling` elementwise over a float array ``p`` (any shape, values in [0, 1]
    or NaN; NaN stays NaN). Returns a float64 array of the same shape. Used by the bootstrap of
    :mod:`tasks.analysis.predictors`.

    Raises:
        ValueError: a non-NaN value outside [0, 1], or ``beta`` not a number >= 0.
    """
    _check_beta(beta)
    p = np.asarray(p, dtype=np.float64)
    finite = ~np.isnan(p)
    if np.any((p[finite] < 0.0) | (p[finite] > 1.0)):
        bad = p[finite][(p[finite] < 0.0) | (p[finite] > 1.0)][:5].tolist()
        raise ValueError(f"p (the reference pass rate) must be in [0, 1], got values {bad}")
    out = np.full(p.shape, np.nan)
    inner = finite & (p > 0.0) & (p < 1.0)
    out[finite & (p == 0.0)] = 0.0
    out[finite & (p == 1.0)] = 1.0
    if beta == 0.0:
        out[inner] = 1.0
    else:
        with np.errstate(over="ignore", divide="ignore"):
            x = np.log(p[inner]) - np.log1p(-p[inner]) + 1.0 / beta
            # stable sigmoid: exp of a non-positive number only
            ex = np.exp(-np.abs(x))
            out[inner] = np.where(x >= 0.0, 1.0 / (1.0 + ex), ex / (1.0 + ex))
    return out


def kl_soft_ceiling_tasks(rates: list[float], beta: float) -> float | None:
    """The harness's KL-soft ceiling over tasks: mean over tasks x of J(p_x, beta)
    (:func:`kl_soft_ceiling`), where ``rates`` holds the reference's pass rate p_x (resolved /
    graded attempts, floats in [0, 1]) on each task with at least one graded attempt.

    Hand values: rates [0, 0.6] (half the tasks never solved) at beta 0.05 give
    0.5 * J(0.6, 0.05) = 0.5 - 6.9e-10, not J(0.3, 0.05) = 1 - 4.8e-9.

    Returns:
        The mean (float in [0, 1]), or None for no task.

    Raises:
        ValueError: a rate outside [0, 1] or a bad ``beta`` (see :func:`kl_soft_ceiling`).
    """
    if not rates:
        return None
    return mean([kl_soft_ceiling(float(p), beta) for p in rates])


def check_evaluation_rows(evaluations: list[dict[str, Any]]) -> None:
    """Raise ValueError naming the first row and column that is missing, or the first unknown
    ``status`` (allowed: resolved, unresolved, timeout, infra_error)."""
    for i, r in enumerate(evaluations):
        for c in EVAL_COLUMNS:
            if c not in r:
                raise ValueError(f"evaluation row {i} has no column {c!r} (needs {list(EVAL_COLUMNS)})")
        if r["status"] not in _STATUSES:
            raise ValueError(f"evaluation row {i}: status {r['status']!r} is not one of {sorted(_STATUSES)}")


def task_outcomes(evaluations: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, tuple[int, int, int]]]:
    """Per (checkpoint, harness_name) cell, per task_id: ``(n_graded, n_resolved, n_infra)`` over
    the final outcome of each planned attempt (:func:`tasks.evaluate.stats.final_attempts`).
    A graded attempt is resolved iff its status is ``resolved`` (a ``timeout`` is a failure).

    Raises:
        ValueError: see :func:`check_evaluation_rows`.
    """
    check_evaluation_rows(evaluations)
    out: dict[tuple[str, str], dict[str, tuple[int, int, int]]] = {}
    for cell, tasks in attempts_by_cell_and_task(final_attempts(evaluations)).items():
        out[cell] = {}
        for t, rs in tasks.items():
            graded = [r for r in rs if r["status"] in GRADED]
            out[cell][t] = (len(graded), sum(r["status"] == "resolved" for r in graded), len(rs) - len(graded))
    return out


def mismatch_cells(evaluations: list[dict[str, Any]], *, k: int, beta: float | None,
                   reference: str = "base") -> list[dict[str, Any]]:
    """P1's ceiling and mismatch per (checkpoint, harness_name) cell, sorted by that pair.

    Args:
        evaluations: sealed evaluation rows (contract ``evaluations``); needs the columns
            ``checkpoint, harness_name, record_id, task_id, attempt, retry, status``. Retries are
            resolved with :func:`tasks.evaluate.stats.final_attempts`.
        k: K of the pass@K ceiling, >= 1.
        beta: the KL coefficient of the KL-soft ceiling (>= 0; ``analyze.kl_beta``), or None to
            leave it out.
        reference: the checkpoint whose per-task pass rates under the same harness are the p_x of
            the KL-soft ceiling (the policy the KL is taken against), by default ``base``.

    Returns:
        One dict per cell with keys
        ``checkpoint, harness_name``;
        ``n_tasks`` (int: tasks with any final attempt in the cell);
        ``attempts`` (int: final attempts = graded + infra_errors);
        ``graded`` (int: resolved + unresolved + timeout);
        ``infra_errors`` (int: final attempts still ``infra_error``, left out of every denominator);
        ``pass_at_1`` (float in [0, 1]: mean over tasks with >= 1 graded attempt of resolved/graded;
        None when no attempt was graded);
        ``ceiling_k`` (= k);
        ``ceiling_tasks`` (int: tasks with >= k graded attempts);
        ``ceiling`` (mean over those tasks of the unbiased pass@k; None if there are none);
        ``ref_pass_at_1`` (the ``reference`` checkpoint's pass_at_1 under the same harness; None if
        that cell is absent or has nothing graded);
        ``kl_beta`` (= beta);
        ``ceiling_kl_soft`` (:func:`kl_soft_ceiling_tasks`: the mean over the reference's graded
        tasks under the harness of J(p_x, beta), per task then averaged; None if beta is None or
        the reference cell has nothing graded);
        ``mismatch`` (= ceiling - pass_at_1, not clamped; None if either is None). The unbiased
        pass@k of a task is >= its c/n (pass@1) over the same attempts, so mismatch >= 0 when every
        task with a graded attempt has >= k of them; it can be negative when the ceiling averages
        over fewer tasks than pass@1 (tasks with < k graded attempts);
        ``mismatch_kl_soft`` (= ceiling_kl_soft - pass_at_1; None if either is None). This CAN be
        negative: the KL-soft ceiling is a model-based estimate from the reference's pass rate,
        and a trained checkpoint (or sampling noise) can exceed it.

    Raises:
        ValueError: k < 1, beta < 0 or not a number, a missing column or an unknown status.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the pass@K of the ceiling) must be an int >= 1, got {k!r}")
    if beta is not None:
        _check_beta(beta)
    outcomes = task_outcomes(evaluations)

    def rates(tasks: dict[str, tuple[int, int, int]]) -> list[float]:
        return [c / n for n, c, _ in tasks.values() if n > 0]

    def p1(tasks: dict[str, tuple[int, int, int]]) -> float | None:
        v = rates(tasks)
        return mean(v) if v else None

    rows = []
    for ck, h in sorted(outcomes):
        tasks = outcomes[(ck, h)]
        pass1 = p1(tasks)
        pk = [pass_at_k(n, c, k) for n, c, _ in tasks.values() if n >= k]
        ceiling = mean(pk) if pk else None
        ref_tasks = outcomes.get((reference, h), {})
        ref = p1(ref_tasks)
        soft = kl_soft_ceiling_tasks(rates(ref_tasks), beta) if beta is not None else None
        graded = sum(n for n, _, _ in tasks.values())
        infra = sum(i for _, _, i in tasks.values())
        rows.append({
            "checkpoint": ck, "harness_name": h, "n_tasks": len(tasks), "attempts": graded + infra,
            "graded": graded, "infra_errors": infra, "pass_at_1": pass1, "ceiling_k": k, "ceiling_tasks": len(pk),
            "ceiling": ceiling, "ref_pass_at_1": ref, "kl_beta": beta, "ceiling_kl_soft": soft,
            "mismatch": None if ceiling is None or pass1 is None else ceiling - pass1,
            "mismatch_kl_soft": None if soft is None or pass1 is None else soft - pass1,
        })
    return rows
