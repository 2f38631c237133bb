"""P1's correlations over its (checkpoint, harness, suite) cells: R^2, Pearson r and Spearman's
rho of each of C, M and C - M with the RL gain and the trained return, each with intervals.

A descriptive table beside the sealed ``p1_predictor_gap`` findings (it decides nothing and is
not an ``eval_findings`` row). Its cells are a finding's ``cells`` and their values those of
:func:`tasks.evaluate.findings.p1_cells` (an arm trained under several seeds: its seed
checkpoints' pass@1 averaged). C - M is the reference's pass@1 in the cell (M = C - pass@1).

Two intervals, both percentile intervals at the findings' level ``1 - alpha / m`` (m: the
plan's findings), over ``plan["bootstrap_resamples"]`` resamples:

- ``*_ci_low`` / ``*_ci_high`` (``interval`` = ``seed-task``, or ``task`` when no arm has two or
  more seeds): the cells held fixed, the measurement noise resampled. Each resample draws the
  test tasks with replacement within each suite (``plan["suite_of"]``; tasks of no suite form
  one stratum), ONE draw shared by every cell and checkpoint (a hard task stays hard for the
  base and every seed), then, for each arm of several seeds in order of first appearance, as
  many of its seed checkpoints with replacement (one draw per arm, shared by the arm's cells).
  Every cell's C, M, gain and return are recomputed with each task weighted by its multiplicity,
  then each statistic. This is :func:`tasks.evaluate.stats.seed_task_bootstrap`'s design with
  tasks stratified by suite, so every suite cell keeps its number of tasks.
- ``*_cell_ci_low`` / ``*_cell_ci_high``: the cells resampled with replacement (their point
  values fixed), as the ``p1_predictor_gap`` finding does: how much the statistic rests on
  which cells were chosen. With ten cells this interval is wide and crude.

A statistic is None with a one-line ``na_reason`` where it is undefined on the data: fewer than
:data:`MIN_CELLS` cells with graded tasks, or a predictor or target
constant over them (range <= ``FLAT_TOL``). A resample where a cell has no graded task drawn or
a side is constant is left out and counted (``resamples_valid``, ``cell_resamples_valid``);
with fewer than half the resamples defined the interval is None and ``ci_na_reason`` says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import rankdata

from tasks.evaluate.findings import p1_cells
from tasks.evaluate.stats import FLAT_TOL, MIN_POINTS, arm_members, fit_na_reason, graded_counts, pass_at_k
from tasks.hashing import seed_from

TARGETS = ("gain", "return")
PREDICTORS = ("C", "M", "C_minus_M")
STATS = ("r2", "r", "rho")
MIN_CELLS = MIN_POINTS  # the run report's R^2 table's rule (tasks.evaluate.stats.fit_na_reason)


def na_reason(x: np.ndarray, y: np.ndarray) -> str:
    """Why the statistics of ``y`` on ``x`` (float64 ``[n]``, the cells with graded tasks) are not
    reported, or "" when they are (:func:`tasks.evaluate.stats.fit_na_reason`, counted in cells)."""
    return fit_na_reason(x, y, unit="cell", statistic="a correlation")


def correlations(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Row-wise statistics of ``y`` on ``x`` (float64 ``[R, n]``, n >= 2): ``r`` (Pearson),
    ``r2`` (= r^2, the R^2 of the OLS line with an intercept), ``slope`` (OLS, y units per x
    unit), ``rho`` (Spearman: Pearson r of the average ranks, ties sharing their mean rank) and
    ``defined`` (bool: both ranges above ``FLAT_TOL``); each ``[R]``, NaN where not defined."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    defined = (np.ptp(x, axis=1) > FLAT_TOL) & (np.ptp(y, axis=1) > FLAT_TOL)

    def pearson(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        da = a - a.mean(axis=1, keepdims=True)
        db = b - b.mean(axis=1, keepdims=True)
        saa, sbb, sab = (da * da).sum(axis=1), (db * db).sum(axis=1), (da * db).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.where(defined, np.clip(sab / np.sqrt(saa * sbb), -1.0, 1.0), np.nan),
                    np.where(defined, sab / saa, np.nan))

    r, slope = pearson(x, y)
    rho, _ = pearson(rankdata(x, method="average", axis=1), rankdata(y, method="average", axis=1))
    return {"r": r, "r2": r * r, "slope": slope, "rho": rho, "defined": defined}


class _Design:
    """The sealed rows as per-(checkpoint, harness), per-task matrices over every task graded in a
    cell's pair, and each cell's task mask (its suite) and checkpoint rows."""

    def __init__(self, rows: list[dict[str, Any]], cells: list[dict[str, str]], k: int, plan: dict[str, Any],
                 reference: str):
        counts = graded_counts(rows)
        suite_of = plan.get("suite_of") or {}
        self.arms = list(dict.fromkeys(c["checkpoint"] for c in cells))
        self.members = {a: arm_members(plan, a) for a in self.arms}
        pairs = list(dict.fromkeys([(reference, c["harness"]) for c in cells] +
                                   [(m, c["harness"]) for c in cells for m in self.members[c["checkpoint"]]]))
        self.tasks = sorted({t for p in pairs for t in counts.get(p, {})})
        tix = {t: i for i, t in enumerate(self.tasks)}
        shape = (len(pairs), len(self.tasks))
        self.v1, self.g1, self.vk, self.gk = (np.zeros(shape) for _ in range(4))
        for pi, p in enumerate(pairs):
            for t, (n, c) in counts.get(p, {}).items():
                self.v1[pi, tix[t]], self.g1[pi, tix[t]] = c / n, 1.0
                if n >= k:
                    self.vk[pi, tix[t]], self.gk[pi, tix[t]] = pass_at_k(n, c, k), 1.0
        row = {p: i for i, p in enumerate(pairs)}
        self.mask = np.array([[c.get("suite") is None or suite_of.get(t) == c["suite"] for t in self.tasks]
                              for c in cells], dtype=np.float64)
        self.base_row = np.array([row[(reference, c["harness"])] for c in cells], dtype=np.int64)
        self.member_rows = [np.array([row[(m, c["harness"])] for m in self.members[c["checkpoint"]]], dtype=np.int64)
                            for c in cells]
        self.cell_arm = [self.arms.index(c["checkpoint"]) for c in cells]
        strata: dict[str, list[int]] = {}
        for i, t in enumerate(self.tasks):
            strata.setdefault(str(suite_of.get(t, "")), []).append(i)
        self.strata = [np.array(v, dtype=np.int64) for _, v in sorted(strata.items())]

    def _rate(self, w: np.ndarray, rows: np.ndarray, v: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Per resample and cell i the weighted mean of ``v[rows[i]]`` over the cell's graded tasks
        (``rows``: one (checkpoint, harness) row per cell): ``[R, n]``."""
        num = np.einsum("rt,ct->rc", w, self.mask * g[rows] * v[rows])
        den = np.einsum("rt,ct->rc", w, self.mask * g[rows])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, num / den, np.nan)

    def metrics(self, w: np.ndarray, pick: list[np.ndarray] | None) -> dict[str, np.ndarray]:
        """Task weights ``w`` ``[R, T]`` and per arm the seed checkpoints drawn ``[R, S]`` (None:
        each once) -> ``C``, ``M``, ``C_minus_M``, ``gain``, ``return``, each ``[R, n_cells]``."""
        p_base = self._rate(w, self.base_row, self.v1, self.g1)
        c = self._rate(w, self.base_row, self.vk, self.gk)
        trained = np.empty_like(p_base)
        for i, rows in enumerate(self.member_rows):
            mask = self.mask[i]
            with np.errstate(divide="ignore", invalid="ignore"):
                per = np.stack([(w @ (mask * self.g1[r] * self.v1[r])) / (w @ (mask * self.g1[r])) for r in rows],
                               axis=1)  # [R, S]: each seed checkpoint's pass@1 in cell i (NaN: no graded task)
            trained[:, i] = per.mean(axis=1) if pick is None else \
                np.take_along_axis(per, pick[self.cell_arm[i]], axis=1).mean(axis=1)
        m = c - p_base
        return {"C": c, "M": m, "C_minus_M": c - m, "gain": trained - p_base, "return": trained}

    def draw(self, rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """The task weights ``[R, T]`` (tasks drawn within each suite, one draw for every cell) and
        per arm the seed checkpoints drawn ``[R, S]`` (an arm of one seed: always it)."""
        w = np.zeros((resamples, len(self.tasks)))
        rr = np.arange(resamples)[:, None]
        for idx in self.strata:
            np.add.at(w, (rr, idx[rng.integers(0, len(idx), (resamples, len(idx)))]), 1.0)
        pick = [rng.integers(0, len(self.members[a]), (resamples, len(self.members[a])))
                if len(self.members[a]) > 1 else np.zeros((resamples, 1), dtype=np.int64) for a in self.arms]
        return w, pick


def p1_cell_sets(plan: dict[str, Any]) -> list[tuple[list[str], list[dict[str, str]]]]:
    """The distinct cell lists of the plan's ``p1_predictor_gap`` findings, in plan order, each
    with the names of the findings that share it."""
    out: list[tuple[list[str], list[dict[str, str]]]] = []
    for f in plan.get("findings") or []:
        if f["measure"] != "p1_predictor_gap":
            continue
        same = [o for o in out if o[1] == f["cells"]]
        if same:
            same[0][0].append(f["name"])
        else:
            out.append(([f["name"]], list(f["cells"])))
    return out


def _interval(vals: np.ndarray, level: float, resamples: int) -> tuple[float | None, float | None]:
    vals = vals[np.isfinite(vals)]
    if vals.size < max(1, resamples // 2):
        return None, None
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(vals, [tail, 1.0 - tail])
    return float(lo), float(hi)


def p1_correlation_table(rows: list[dict[str, Any]], plan: dict[str, Any], reference: str = "base"
                         ) -> list[dict[str, Any]]:
    """One row per (cell set of :func:`p1_cell_sets`, target in :data:`TARGETS`, predictor in
    :data:`PREDICTORS`) for the sealed ``rows`` of an evaluation ``plan`` (its ``findings``,
    ``attempts`` (k of C = pass@k), ``seed``, ``alpha``, ``bootstrap_resamples``, ``arm_seeds``,
    ``suite_of``); intervals and n/a rules as the module docstring says.

    Fields: ``findings`` (the names sharing the cells, comma-separated), ``target``,
    ``predictor``, ``n_cells`` (cells with graded tasks), ``r2``, ``r2_ci_low``, ``r2_ci_high``,
    ``r``, ``r_ci_low``, ``r_ci_high``, ``slope`` (target per predictor unit; no interval),
    ``rho``, ``rho_ci_low``, ``rho_ci_high``, ``r2_cell_ci_low``, ``r2_cell_ci_high``,
    ``rho_cell_ci_low``, ``rho_cell_ci_high``, ``interval`` (``seed-task`` or ``task``),
    ``resamples``, ``resamples_valid``, ``cell_resamples_valid``, ``level``, ``seed``
    (``seed_from(plan["seed"], "p1_correlations", first finding name)``; the cell bootstrap
    uses ``seed_from(seed, "cells")``), ``na_reason``, ``ci_na_reason``. r2 in [0, 1], r and
    rho in [-1, 1]; None where undefined. Deterministic given the plan.

    Raises:
        ValueError: a cell names a suite and the plan has no ``suite_of`` (from p1_cells).
    """
    k = int(plan["attempts"])
    resamples = int(plan["bootstrap_resamples"])
    level = 1.0 - plan["alpha"] / max(len(plan.get("findings") or []), 1)
    out = []
    for names, cells in p1_cell_sets(plan):
        seed = seed_from(plan["seed"], "p1_correlations", names[0])
        pts = p1_cells(rows, cells, k, reference, members=lambda n: arm_members(plan, n),
                       suite_of=plan.get("suite_of"))
        ok = ~np.isnan(pts["C"])
        kept = [c for c, o in zip(cells, ok) if o]
        pts["C_minus_M"] = pts["C"] - pts["M"]
        seeded = any(len(arm_members(plan, c["checkpoint"])) > 1 for c in kept)
        boot: dict[str, np.ndarray] = {}
        valid_cells = np.zeros(resamples, dtype=bool)
        if len(kept) >= MIN_CELLS:
            d = _Design(rows, kept, k, plan, reference)
            w, pick = d.draw(np.random.default_rng(seed), resamples)
            boot = d.metrics(w, pick)
            valid_cells = np.all([np.isfinite(v).all(axis=1) for v in boot.values()], axis=0)
            cell_idx = np.random.default_rng(seed_from(seed, "cells")).integers(0, len(kept), (resamples, len(kept)))
        for target in TARGETS:
            for pred in PREDICTORS:
                x, y = pts[pred][ok], pts[target][ok]
                row: dict[str, Any] = {"findings": ", ".join(names), "target": target, "predictor": pred,
                                       "n_cells": int(ok.sum()), "slope": None,
                                       **{f"{s}{e}": None for s in STATS for e in ("", "_ci_low", "_ci_high")},
                                       **{f"{s}_cell_ci_{e}": None for s in ("r2", "rho") for e in ("low", "high")},
                                       "interval": "seed-task" if seeded else "task", "resamples": resamples,
                                       "resamples_valid": 0, "cell_resamples_valid": 0, "level": level, "seed": seed,
                                       "na_reason": na_reason(x, y), "ci_na_reason": ""}
                if not row["na_reason"]:
                    est = correlations(x[None, :], y[None, :])
                    row.update({s: float(est[s][0]) for s in STATS}, slope=float(est["slope"][0]))
                    b = correlations(boot[pred][valid_cells], boot[target][valid_cells]) if valid_cells.any() else \
                        {s: np.empty(0) for s in STATS} | {"defined": np.empty(0, dtype=bool)}
                    cb = correlations(x[cell_idx], y[cell_idx])
                    row.update(resamples_valid=int(b["defined"].sum()), cell_resamples_valid=int(cb["defined"].sum()))
                    for s in STATS:
                        row[f"{s}_ci_low"], row[f"{s}_ci_high"] = _interval(b[s], level, resamples)
                    for s in ("r2", "rho"):
                        row[f"{s}_cell_ci_low"], row[f"{s}_cell_ci_high"] = _interval(cb[s], level, resamples)
                    short = [f"{what} bootstrap: {n} of {resamples} resamples defined" for what, n in
                             (("seed-task", row["resamples_valid"]), ("cell", row["cell_resamples_valid"]))
                             if n < max(1, resamples // 2)]
                    if short:
                        row["ci_na_reason"] = "; ".join(short) + f" (an interval needs {max(1, resamples // 2)})"
                out.append(row)
    return out


def _fmt(v: float | None, signed: bool = False) -> str:
    return "n/a" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """:func:`p1_correlation_table` rows as one markdown table (``n/a`` for a missing value, the
    reason in the last column)."""
    head = ("| findings | target | predictor | cells | R^2 [seed-task] [cell] | r [seed-task] | slope "
            "| rho [seed-task] [cell] | resamples defined (seed-task, cell) | n/a |\n"
            "| --- | --- | --- | ---: | --- | --- | ---: | --- | ---: | --- |\n")

    def iv(lo: float | None, hi: float | None, signed: bool) -> str:
        return "n/a" if lo is None or hi is None else f"[{_fmt(lo, signed)}, {_fmt(hi, signed)}]"

    lines = []
    for r in rows:
        lines.append(
            f"| {r['findings']} | {r['target']} | {r['predictor'].replace('_minus_', ' - ')} | {r['n_cells']} "
            f"| {_fmt(r['r2'])} {iv(r['r2_ci_low'], r['r2_ci_high'], False)} "
            f"{iv(r['r2_cell_ci_low'], r['r2_cell_ci_high'], False)} "
            f"| {_fmt(r['r'], True)} {iv(r['r_ci_low'], r['r_ci_high'], True)} | {_fmt(r['slope'], True)} "
            f"| {_fmt(r['rho'], True)} {iv(r['rho_ci_low'], r['rho_ci_high'], True)} "
            f"{iv(r['rho_cell_ci_low'], r['rho_cell_ci_high'], True)} "
            f"| {r['resamples_valid']}, {r['cell_resamples_valid']} of {r['resamples']} | {'; '.join(x for x in (r['na_reason'], r['ci_na_reason']) if x)} |")
    return head + "\n".join(lines) + "\n"
