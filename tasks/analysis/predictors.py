"""P1's claim test (METHODS.md, "ceiling minus mismatch"): across (checkpoint, harness) cells, is
the deployed return (and the RL gain) predicted better by C - M than by the ceiling C or the
mismatch M alone? Reported as the R^2 of each single predictor side by side, with a
task-clustered bootstrap interval.

Points are the cells (trained checkpoint, harness) of a sealed evaluation, every checkpoint but the
reference; the predictors are measured on the reference checkpoint under the same harness (what
the harness offers before training), the targets on the trained checkpoint.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from tasks.analysis.ceiling import _check_beta, kl_soft_ceiling_array, task_outcomes
from tasks.evaluate.stats import pass_at_k

TARGETS = ("gain", "return")
PREDICTORS = ("C", "C_kl_soft", "M", "C_minus_M")


def _ols_r2(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise single-predictor OLS with intercept over the last axis of ``x`` and ``y``
    (float64, shape [R, n], n >= 1). Returns (r2, slope, intercept, degenerate), each shape [R].

    r2 = sxy^2 / (sxx syy) (the squared Pearson correlation, which equals the R^2 of OLS with an
    intercept); when x or y has (numerically) zero variance, r2 = 0, slope = 0, intercept =
    mean(y) and degenerate = True. "Zero" is a range (max - min) <= 1e-12 * max(1, max |v|).
    """
    xm = x.mean(axis=1, keepdims=True)
    ym = y.mean(axis=1, keepdims=True)
    dx, dy = x - xm, y - ym
    sxx = (dx * dx).sum(axis=1)
    syy = (dy * dy).sum(axis=1)
    sxy = (dx * dy).sum(axis=1)

    def flat(v: np.ndarray) -> np.ndarray:
        return np.ptp(v, axis=1) <= 1e-12 * np.maximum(1.0, np.abs(v).max(axis=1))

    x_flat, degenerate = flat(x), flat(x) | flat(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(degenerate, 0.0, np.clip(sxy * sxy / (sxx * syy), 0.0, 1.0))
        slope = np.where(x_flat, 0.0, sxy / sxx)
    intercept = ym[:, 0] - slope * xm[:, 0]
    return r2, slope, intercept, degenerate


def r2_table(evaluations: list[dict[str, Any]], *, k: int, beta: float | None, reference: str = "base",
             resamples: int = 2000, seed: int = 0, level: float = 0.95,
             extra_predictors: dict[str, dict[tuple[str, str], float]] | None = None) -> list[dict[str, Any]]:
    """R^2 of each single predictor of each target, with a task-clustered bootstrap interval.

    Points: every cell (checkpoint, h) of ``evaluations`` with checkpoint != ``reference`` and a
    ``reference`` cell under the same harness h. Cell metrics follow
    :func:`tasks.analysis.ceiling.mismatch_cells` (final attempts, infra errors out of the
    denominators, timeouts failures): pass@1 = mean over tasks with >= 1 graded attempt of c/n;
    ceiling = mean over tasks with >= k graded attempts of the unbiased pass@k.

    Predictors, all measured on the reference checkpoint under h:
      ``C``          the pass@K ceiling of (reference, h);
      ``C_kl_soft``  :func:`tasks.analysis.ceiling.kl_soft_ceiling` (pass@1 of (reference, h), beta);
                     left out (no rows) when ``beta`` is None;
      ``M``          C - pass@1 of (reference, h) (the simple mismatch estimator);
      ``C_minus_M``  C - M. With the simple estimator this is identically the reference's pass@1;
                     it differs from it only through ``extra_predictors`` (e.g. a per-step M).
    plus each of ``extra_predictors``: name -> {(checkpoint, h) or (reference, h): value}; a
    point takes its (checkpoint, h) value, else its (reference, h) value, else it is left out of
    that predictor's rows. These values are FIXED: the bootstrap resamples only the targets for
    them (column ``predictor_bootstrapped`` = False), e.g. a branching estimate of M whose own
    sampling error is not modelled here.

    Targets: ``gain`` = pass@1(checkpoint, h) - pass@1(reference, h); ``return`` = pass@1(checkpoint, h).

    R^2: of the OLS fit target = intercept + slope * predictor over the points where both are
    defined (= squared Pearson r). Defined as 0, with ``degenerate`` = True, when the predictor
    or the target has zero variance over the points (including a single point); with no point,
    r2/slope/intercept/ci are None and ``degenerate`` is True.

    Bootstrap (Efron & Tibshirani 1993, ch. 13, percentile interval): each of ``resamples``
    resamples draws as many task ids as there are distinct task ids over all cells, with
    replacement (``numpy.random.default_rng(seed)``), the SAME draw for every cell; each cell's
    metrics are recomputed with each task weighted by its multiplicity, then every predictor,
    target and R^2. A resample where some point's predictor or target is undefined (none of the
    cell's tasks drawn) is left out of that row's interval (``resamples_valid`` counts those kept);
    ``ci_low``/``ci_high`` are the (1 - level)/2 and (1 + level)/2 quantiles of the kept R^2 values.
    R^2 is bounded by 1 and a resample duplicates tasks (adding noise to both axes), so resampled
    R^2 values are attenuated: for an estimate close to 1 the percentile interval can lie entirely
    below it (e.g. r2 0.992, interval [0.867, 0.990]); read such an interval as "at most".

    Args:
        evaluations: sealed evaluation rows (see :func:`tasks.analysis.ceiling.mismatch_cells`).
        k: K of the pass@K ceiling, int >= 1.
        beta: KL coefficient (>= 0) of the KL-soft ceiling, or None.
        reference: the checkpoint the predictors are measured on (and gains are relative to).
        resamples: bootstrap resamples, int >= 1.
        seed: the bootstrap seed (int).
        level: interval confidence level in (0, 1).
        extra_predictors: fixed predictors, see above; names must not clash with ``PREDICTORS``.

    Returns:
        Rows, targets in the order ("gain", "return"), predictors in the order ``PREDICTORS`` then
        the extra names sorted: ``target, predictor, r2, ci_low, ci_high, n_points, slope,
        intercept, degenerate, predictor_bootstrapped, resamples, resamples_valid, seed, level``.
        r2 and the interval are unitless in [0, 1]; slope is target units per predictor unit.

    Raises:
        ValueError: k, beta, resamples or level out of range; an extra predictor whose name clashes
            or whose value is not a finite number; bad evaluation rows (see
            :func:`tasks.analysis.ceiling.check_evaluation_rows`).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the pass@K of the ceiling) must be an int >= 1, got {k!r}")
    if beta is not None:
        _check_beta(beta)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not (isinstance(level, numbers.Real) and 0.0 < level < 1.0):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    extra = dict(extra_predictors or {})
    for name, values in extra.items():
        if name in PREDICTORS:
            raise ValueError(f"extra predictor name {name!r} clashes with a built-in predictor {PREDICTORS}")
        for key, v in values.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"extra predictor {name!r} at {key!r}: value {v!r} is not a finite number")

    outcomes = task_outcomes(evaluations)
    cells = sorted(outcomes)
    col = {c: i for i, c in enumerate(cells)}
    task_ids = sorted({t for tasks in outcomes.values() for t in tasks})
    tix = {t: i for i, t in enumerate(task_ids)}
    n_t = len(task_ids)
    # per cell x task: pass@1 and pass@k values with their masks
    v1 = np.zeros((len(cells), n_t))
    g1 = np.zeros((len(cells), n_t))
    vk = np.zeros((len(cells), n_t))
    gk = np.zeros((len(cells), n_t))
    for ci, cell in enumerate(cells):
        for t, (n, c, _) in outcomes[cell].items():
            if n > 0:
                v1[ci, tix[t]], g1[ci, tix[t]] = c / n, 1.0
            if n >= k:
                vk[ci, tix[t]], gk[ci, tix[t]] = pass_at_k(n, c, k), 1.0

    points = [(ck, h) for ck, h in cells if ck != reference and (reference, h) in col]
    ck_col = np.array([col[p] for p in points], dtype=np.int64)
    ref_col = np.array([col[(reference, p[1])] for p in points], dtype=np.int64)

    def metrics(w: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """w: task weights [R, n_t] -> predictor and target values [R, n_points] (NaN = undefined)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            p1 = (w @ (g1 * v1).T) / (w @ g1.T)
            pk = (w @ (gk * vk).T) / (w @ gk.T)
        ref_p1, c_ref, ck_p1 = p1[:, ref_col], pk[:, ref_col], p1[:, ck_col]
        m = c_ref - ref_p1
        preds = {"C": c_ref, "M": m, "C_minus_M": c_ref - m}
        if beta is not None:
            preds["C_kl_soft"] = kl_soft_ceiling_array(ref_p1, beta)
        for name, values in extra.items():
            fixed = np.array([values.get(p, values.get((reference, p[1]), math.nan)) for p in points], dtype=np.float64)
            preds[name] = np.broadcast_to(fixed, ck_p1.shape)
        return preds, {"gain": ck_p1 - ref_p1, "return": ck_p1}

    est_x, est_y = metrics(np.ones((1, n_t)))
    rng = np.random.default_rng(seed)
    if points and n_t:
        draws = rng.integers(0, n_t, size=(resamples, n_t))
        w = np.bincount((draws + np.arange(resamples)[:, None] * n_t).ravel(), minlength=resamples * n_t)
        boot_x, boot_y = metrics(w.reshape(resamples, n_t).astype(np.float64))
    else:
        boot_x, boot_y = est_x, est_y
    tail = (1.0 - level) / 2.0
    rows = []
    for target in TARGETS:
        for pred in [p for p in PREDICTORS if p in est_x] + sorted(extra):
            x, y = est_x[pred][0], est_y[target][0]
            keep = np.isfinite(x) & np.isfinite(y)
            row: dict[str, Any] = {
                "target": target, "predictor": pred, "r2": None, "ci_low": None, "ci_high": None,
                "n_points": int(keep.sum()), "slope": None, "intercept": None, "degenerate": True,
                "predictor_bootstrapped": pred not in extra, "resamples": resamples, "resamples_valid": 0,
                "seed": seed, "level": level,
            }
            if keep.any():
                r2, slope, icpt, degen = _ols_r2(x[keep][None, :], y[keep][None, :])
                row.update(r2=float(r2[0]), slope=float(slope[0]), intercept=float(icpt[0]), degenerate=bool(degen[0]))
                bx, by = boot_x[pred][:, keep], boot_y[target][:, keep]
                ok = np.isfinite(bx).all(axis=1) & np.isfinite(by).all(axis=1)
                if ok.any():
                    br2 = _ols_r2(bx[ok], by[ok])[0]
                    lo, hi = np.quantile(br2, [tail, 1.0 - tail])
                    row.update(ci_low=float(lo), ci_high=float(hi), resamples_valid=int(ok.sum()))
            rows.append(row)
    return rows
