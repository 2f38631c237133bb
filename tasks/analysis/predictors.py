"""P1's claim test (docs/methods/p1-ceiling-mismatch.md): across (checkpoint, harness) points, is
the deployed return (and the RL gain) predicted better by C - M than by the ceiling C or the
mismatch M alone? Reported as the R^2 of each single predictor side by side, with a
task-clustered bootstrap interval, beside the points themselves (:func:`p1_points`).

Points are the cells (trained checkpoint, harness) of a sealed evaluation, every checkpoint but the
reference; the predictors are measured on the reference checkpoint (the base policy) under the
same harness (what the harness offers before training), the targets on the trained checkpoint:

- ``C``              the pass@K ceiling of (reference, h) (mean over tasks of the unbiased pass@K);
- ``C_kl_soft``      the KL-soft ceiling of (reference, h): mean over tasks of J(p_x, beta)
                     (:func:`tasks.analysis.ceiling.kl_soft_ceiling_tasks`);
- ``M``              C - pass@1 of (reference, h): the simple mismatch estimator;
- ``M_step``         the per-step mismatch of (reference, h) by branching
                     (:func:`tasks.analysis.branching.step_mismatch_summary`); given, not resampled;
- ``C_minus_M``      C - M. With the simple estimator this is identically the reference's pass@1
                     (so its R^2 is that of "the base return predicts the trained return");
- ``C_minus_M_step`` C - M_step: P1's predicted return with the per-step mismatch;
- targets ``gain`` = pass@1(checkpoint, h) - pass@1(reference, h) and ``return`` = pass@1(checkpoint, h).

An R^2 is reported only where it means something; otherwise it is None with ``na_reason``
(:func:`na_reason`): fewer than :data:`MIN_POINTS` points (two points always fit a line exactly,
three or four leave one or two degrees of freedom), a predictor or target constant over the points
(range below :data:`FLAT_TOL`), or a predictor not measured (no M_step without branching).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from tasks.analysis.ceiling import _check_beta, kl_soft_ceiling_array, task_outcomes
from tasks.evaluate.stats import FLAT_TOL, MIN_POINTS, fit_na_reason, pass_at_k

TARGETS = ("gain", "return")
PREDICTORS = ("C", "C_kl_soft", "M", "M_step", "C_minus_M", "C_minus_M_step")
STEP_PREDICTORS = ("M_step", "C_minus_M_step")
NOT_MEASURED_STEP = ("not measured: M_step needs the per-step branching of the reference checkpoint "
                     "(analyze.branching.episodes_per_harness > 0 with the reference in analyze.branching.checkpoints)")


def na_reason(x: np.ndarray, y: np.ndarray, *, min_points: int = MIN_POINTS) -> str:
    """Why the R^2 of ``y`` on ``x`` (float64 arrays of shape [n], the defined points) is not
    reported, or "" when it is (:func:`tasks.evaluate.stats.fit_na_reason`: >= ``min_points``
    points, neither side constant)."""
    return fit_na_reason(x, y, min_points=min_points)


def _ols_r2(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise single-predictor OLS with intercept over the last axis of ``x`` and ``y``
    (float64, shape [R, n], n >= 2). Returns (r2, slope, intercept, defined), each shape [R]:
    r2 = sxy^2 / (sxx syy) (the squared Pearson correlation = the R^2 of OLS with an intercept),
    slope = sxy / sxx, intercept = mean(y) - slope mean(x); ``defined`` is False (and r2, slope,
    intercept NaN) where x or y has a range <= :data:`FLAT_TOL` (R^2 undefined)."""
    xm = x.mean(axis=1, keepdims=True)
    ym = y.mean(axis=1, keepdims=True)
    dx, dy = x - xm, y - ym
    sxx = (dx * dx).sum(axis=1)
    syy = (dy * dy).sum(axis=1)
    sxy = (dx * dy).sum(axis=1)
    defined = (np.ptp(x, axis=1) > FLAT_TOL) & (np.ptp(y, axis=1) > FLAT_TOL)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(defined, np.clip(sxy * sxy / (sxx * syy), 0.0, 1.0), np.nan)
        slope = np.where(defined, sxy / sxx, np.nan)
    intercept = np.where(defined, ym[:, 0] - np.nan_to_num(slope) * xm[:, 0], np.nan)
    return r2, slope, intercept, defined


def _check_args(k: int, beta: float | None, m_step: dict[str, float] | None) -> dict[str, float]:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the pass@K of the ceiling) must be an int >= 1, got {k!r}")
    if beta is not None:
        _check_beta(beta)
    steps = dict(m_step or {})
    for h, v in steps.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise ValueError(f"m_step[{h!r}]: value {v!r} is not a finite number")
    return steps


class _Design:
    """The evaluation as per-(cell, task) matrices, and the points (trained checkpoint, harness)."""

    def __init__(self, evaluations: list[dict[str, Any]], k: int, beta: float | None, reference: str,
                 m_step: dict[str, float]):
        outcomes = task_outcomes(evaluations)
        self.beta, self.m_step = beta, m_step
        cells = sorted(outcomes)
        col = {c: i for i, c in enumerate(cells)}
        self.task_ids = sorted({t for tasks in outcomes.values() for t in tasks})
        tix = {t: i for i, t in enumerate(self.task_ids)}
        shape = (len(cells), len(self.task_ids))
        self.v1, self.g1, self.vk, self.gk = (np.zeros(shape) for _ in range(4))
        for ci, cell in enumerate(cells):
            for t, (n, c, _) in outcomes[cell].items():
                if n > 0:
                    self.v1[ci, tix[t]], self.g1[ci, tix[t]] = c / n, 1.0
                if n >= k:
                    self.vk[ci, tix[t]], self.gk[ci, tix[t]] = pass_at_k(n, c, k), 1.0
        # the per-task KL-soft ceiling J(p_x) of every cell (used for the reference's cells)
        self.js = kl_soft_ceiling_array(self.v1, beta) if beta is not None else None
        self.points = [(ck, h) for ck, h in cells if ck != reference and (reference, h) in col]
        self.ck_col = np.array([col[p] for p in self.points], dtype=np.int64)
        self.ref_col = np.array([col[(reference, p[1])] for p in self.points], dtype=np.int64)

    def metrics(self, w: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """w: task weights [R, n_tasks] -> predictor and target values [R, n_points] (NaN =
        undefined); the targets also hold ``reference``, the reference's pass@1 at each point."""
        with np.errstate(divide="ignore", invalid="ignore"):
            p1 = (w @ (self.g1 * self.v1).T) / (w @ self.g1.T)
            pk = (w @ (self.gk * self.vk).T) / (w @ self.gk.T)
            soft = (w @ (self.g1 * np.nan_to_num(self.js)).T) / (w @ self.g1.T) if self.js is not None else None
        ref_p1, c_ref, ck_p1 = p1[:, self.ref_col], pk[:, self.ref_col], p1[:, self.ck_col]
        m = c_ref - ref_p1
        step = np.broadcast_to(np.array([self.m_step.get(h, math.nan) for _, h in self.points], dtype=np.float64),
                               ck_p1.shape)
        preds = {"C": c_ref, "M": m, "M_step": step, "C_minus_M": c_ref - m, "C_minus_M_step": c_ref - step}
        if soft is not None:
            preds["C_kl_soft"] = soft[:, self.ref_col]
        return preds, {"gain": ck_p1 - ref_p1, "return": ck_p1, "reference": ref_p1}


def p1_points(evaluations: list[dict[str, Any]], *, k: int, beta: float | None, reference: str = "base",
              m_step: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The points of P1's claim test, one row per (trained checkpoint, harness) with a reference
    cell under the same harness, sorted by that pair: the predictors measured on the reference
    under the harness and the targets of the checkpoint (module docstring).

    Args:
        evaluations: sealed evaluation rows (see :func:`tasks.analysis.ceiling.mismatch_cells`).
        k: K of the pass@K ceiling, int >= 1.
        beta: the KL-soft ceiling's beta (``analyze.kl_beta``), or None (C_kl_soft left null).
        reference: the checkpoint the predictors are measured on.
        m_step: harness name -> the reference's per-step mismatch under it (None: not measured).

    Returns:
        Rows ``checkpoint, harness_name, reference, ref_pass_at_1, C, C_kl_soft, M, M_step,
        C_minus_M, C_minus_M_step, gain, trained_return`` (floats in rate units; None where
        undefined: no task with K graded attempts, no M_step, no beta).

    Raises:
        ValueError: bad k, beta or m_step value; bad evaluation rows.
    """
    d = _Design(evaluations, k, beta, reference, _check_args(k, beta, m_step))
    x, y = d.metrics(np.ones((1, len(d.task_ids))))

    def val(a: np.ndarray, i: int) -> float | None:
        v = float(a[0, i])
        return v if math.isfinite(v) else None

    out = []
    for i, (ck, h) in enumerate(d.points):
        out.append({"checkpoint": ck, "harness_name": h, "reference": reference,
                    "ref_pass_at_1": val(y["reference"], i),
                    **{p: (val(x[p], i) if p in x else None) for p in PREDICTORS},
                    "gain": val(y["gain"], i), "trained_return": val(y["return"], i)})
    return out


def r2_table(evaluations: list[dict[str, Any]], *, k: int, beta: float | None, reference: str = "base",
             resamples: int = 2000, seed: int = 0, level: float = 0.95,
             m_step: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """R^2 of each single predictor of each target, with a task-clustered bootstrap interval, or
    "n/a" with the reason.

    Points, predictors and targets: see the module docstring and :func:`p1_points` (cell metrics
    as :func:`tasks.analysis.ceiling.mismatch_cells`: final attempts, infra errors out of the
    denominators, timeouts failures).

    R^2: of the OLS fit target = intercept + slope * predictor over the points where both are
    defined (= squared Pearson r), reported only when :func:`na_reason` is "" (>= MIN_POINTS
    points, neither side constant); else ``r2``, ``slope``, ``intercept`` and the interval are None
    and ``na_reason`` says why (M_step rows without branching: :data:`NOT_MEASURED_STEP`).

    Bootstrap (Efron & Tibshirani 1993, ch. 13, percentile interval): each of ``resamples``
    resamples draws as many task ids as there are distinct task ids over all cells, with
    replacement (``numpy.random.default_rng(seed)``), the SAME draw for every cell; each cell's
    metrics are recomputed with each task weighted by its multiplicity, then every predictor,
    target and R^2. M_step is FIXED (its own branching error is not modelled;
    ``predictor_bootstrapped`` False for M_step, and C_minus_M_step resamples only its C). A
    resample where some point is undefined (none of the cell's tasks drawn) or where the R^2 is
    undefined (a side constant in the resample) is left out (``resamples_valid`` counts those
    kept); ``ci_low``/``ci_high`` are the (1 - level)/2 and (1 + level)/2 quantiles of the kept
    R^2 values. R^2 is bounded by 1 and a resample duplicates tasks (adding noise to both axes), so
    resampled R^2 values are attenuated: for an estimate close to 1 the percentile interval can lie
    entirely below it; read such an interval as "at most".

    Args:
        evaluations: sealed evaluation rows.
        k: K of the pass@K ceiling, int >= 1.
        beta: KL coefficient (>= 0) of the KL-soft ceiling, or None (no C_kl_soft rows).
        reference: the checkpoint the predictors are measured on (and gains are relative to).
        resamples: bootstrap resamples, int >= 1.
        seed: the bootstrap seed (int).
        level: interval confidence level in (0, 1).
        m_step: harness name -> the reference's per-step mismatch (None or {}: not measured).

    Returns:
        Rows, targets in the order ("gain", "return"), predictors in the order ``PREDICTORS``
        (C_kl_soft only with a beta): ``target, predictor, r2, ci_low, ci_high, n_points, slope,
        intercept, na_reason, predictor_bootstrapped, resamples, resamples_valid, seed, level``.
        r2 and the interval are unitless in [0, 1]; slope is target units per predictor unit.

    Raises:
        ValueError: k, beta, resamples or level out of range; an m_step value that is not a finite
            number; bad evaluation rows (see :func:`tasks.analysis.ceiling.check_evaluation_rows`).
    """
    steps = _check_args(k, beta, m_step)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not (isinstance(level, numbers.Real) and 0.0 < level < 1.0):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    d = _Design(evaluations, k, beta, reference, steps)
    n_t = len(d.task_ids)
    est_x, est_y = d.metrics(np.ones((1, n_t)))
    rng = np.random.default_rng(seed)
    if d.points and n_t:
        draws = rng.integers(0, n_t, size=(resamples, n_t))
        w = np.bincount((draws + np.arange(resamples)[:, None] * n_t).ravel(), minlength=resamples * n_t)
        boot_x, boot_y = d.metrics(w.reshape(resamples, n_t).astype(np.float64))
    else:
        boot_x, boot_y = est_x, est_y
    tail = (1.0 - level) / 2.0
    rows = []
    for target in TARGETS:
        for pred in [p for p in PREDICTORS if p in est_x]:
            x, y = est_x[pred][0], est_y[target][0]
            keep = np.isfinite(x) & np.isfinite(y)
            row: dict[str, Any] = {
                "target": target, "predictor": pred, "r2": None, "ci_low": None, "ci_high": None,
                "n_points": int(keep.sum()), "slope": None, "intercept": None, "na_reason": "",
                "predictor_bootstrapped": pred != "M_step", "resamples": resamples, "resamples_valid": 0,
                "seed": seed, "level": level,
            }
            if pred in STEP_PREDICTORS and not keep.any():
                row["na_reason"] = NOT_MEASURED_STEP
            else:
                row["na_reason"] = na_reason(x[keep], y[keep])
            if not row["na_reason"]:
                r2, slope, icpt, _ = _ols_r2(x[keep][None, :], y[keep][None, :])
                row.update(r2=float(r2[0]), slope=float(slope[0]), intercept=float(icpt[0]))
                bx, by = boot_x[pred][:, keep], boot_y[target][:, keep]
                ok = np.isfinite(bx).all(axis=1) & np.isfinite(by).all(axis=1)
                if ok.any():
                    br2, _, _, defined = _ols_r2(bx[ok], by[ok])
                    br2 = br2[defined]
                    if br2.size:
                        lo, hi = np.quantile(br2, [tail, 1.0 - tail])
                        row.update(ci_low=float(lo), ci_high=float(hi), resamples_valid=int(br2.size))
            rows.append(row)
    return rows


def rank_correlations(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spearman's rank correlation of each predictor with each target over :func:`p1_points` rows:
    the Pearson correlation of their average ranks (pandas ``Series.corr(method="spearman")``;
    Spearman 1904), over the points where both are defined. A rank correlation asks whether the
    predictor orders the points as the target does, which R^2 (a straight line) does not.

    Args:
        points: rows of :func:`p1_points` (``C``, ``C_kl_soft``, ``M``, ``M_step``, ``C_minus_M``,
            ``C_minus_M_step``, ``gain``, ``trained_return``; floats or None).

    Returns:
        One row per (target in :data:`TARGETS`, predictor in :data:`PREDICTORS`): ``target``,
        ``predictor``, ``n_points``, ``rho`` (float in [-1, 1], or None) and ``na_reason``
        (:func:`na_reason`'s rule: fewer than :data:`MIN_POINTS` points or a constant side; a
        step predictor with no point says it was not measured).
    """
    import pandas as pd

    out = []
    for target in TARGETS:
        tkey = "trained_return" if target == "return" else target
        for p in PREDICTORS:
            pairs = [(r[p], r[tkey]) for r in points if r.get(p) is not None and r.get(tkey) is not None]
            x = np.array([a for a, _ in pairs], dtype=np.float64)
            y = np.array([b for _, b in pairs], dtype=np.float64)
            why = NOT_MEASURED_STEP if (p in STEP_PREDICTORS and not pairs) else na_reason(x, y)
            rho = None if why else float(pd.Series(x).corr(pd.Series(y), method="spearman"))
            out.append({"target": target, "predictor": p, "n_points": len(pairs),
                        "rho": rho if rho is None or math.isfinite(rho) else None, "na_reason": why})
    return out
