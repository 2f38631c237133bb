"""The papers' headlines as pre-registered findings: a measure, its interval, and a verdict by a
rule fixed before any attempt ran (docs/findings-rules.md).

Each finding is one of ``plan["findings"]`` (from ``evaluate.findings``, sealed in the plan and
the pre-registration). It is computed from the sealed rows and the contrast table only, with
seeded bootstraps, so :mod:`tasks.evaluate.verify` recomputes it from the files like every other
statistic of the evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.evaluate.stats import GRADED, _per_task, final_attempts
from tasks.hashing import seed_from

VERDICTS = ("reproduced", "not reproduced", "inconclusive")


def verdict(claim: str, estimate: float | None, ci_low: float | None, ci_high: float | None, margin: float,
            control_estimate: float | None = None) -> tuple[str, str]:
    """``(verdict, reason)`` of one finding by the pre-registered rule (docs/findings-rules.md).

    - ``increase``: *reproduced* when the interval lies above 0 and, with a control, the
      control's estimate is below this estimate; *not reproduced* when the interval lies below
      ``margin`` (any effect is smaller than the smallest of interest; with margin 0: the effect
      is negative); else *inconclusive* (a positive interval whose control moved as much is
      inconclusive: the gain is not the reward's doing).
    - ``no_increase`` (a - b is at most ``margin``): *reproduced* when the interval's upper end is
      at most ``margin``; *not reproduced* when its lower end is above ``margin``; else
      *inconclusive*.

    A finding without an estimate (a cell below the graded-coverage rule, no common tasks) is
    *inconclusive*. Returns one of :data:`VERDICTS` and a one-line reason.

    Raises:
        ValueError: unknown ``claim``.
    """
    if estimate is None or ci_low is None or ci_high is None:
        return "inconclusive", "no estimate (a cell below the coverage rule, or no common tasks)"
    iv = f"[{ci_low:+.3f}, {ci_high:+.3f}]"
    if claim == "increase":
        if ci_low > 0:
            if control_estimate is not None and control_estimate >= estimate:
                return "inconclusive", (f"interval {iv} above 0, but the random-reward control moved as much "
                                        f"({control_estimate:+.3f} >= {estimate:+.3f})")
            ctl = "" if control_estimate is None else f", control {control_estimate:+.3f} below it"
            return "reproduced", f"interval {iv} above 0{ctl}"
        if ci_high < margin:
            return "not reproduced", f"interval {iv} below the smallest effect of interest {margin:+.3f}"
        return "inconclusive", f"interval {iv} includes 0 and reaches {margin:+.3f}"
    if claim == "no_increase":
        if ci_high <= margin:
            return "reproduced", f"interval {iv} at most the margin {margin:+.3f}"
        if ci_low > margin:
            return "not reproduced", f"interval {iv} above the margin {margin:+.3f}"
        return "inconclusive", f"interval {iv} straddles the margin {margin:+.3f}"
    raise ValueError(f"finding claim {claim!r} is not 'increase' or 'no_increase'")


def _task_rates(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (checkpoint, harness): per task, the resolved share of its graded final attempts."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key, tasks in _per_task(final_attempts(rows)).items():
        for t, rs in tasks.items():
            g = [r for r in rs if r["status"] in GRADED]
            if g:
                out.setdefault(key, {})[t] = sum(r["resolved"] for r in g) / len(g)
    return out


def spread_gap(rates: np.ndarray) -> float:
    """How much more the harness moves pass@1 than the checkpoint does.

    ``rates``: float ``[C, H, T]``, per checkpoint, evaluation harness and task the success rate.
    With P[c, h] the mean over tasks: the harness spread is the mean over checkpoints of
    ``max_h P - min_h P``, the recipe spread the mean over harnesses of ``max_c P - min_c P``;
    returns harness spread minus recipe spread (success-rate points). P4's headline: the
    evaluation harness moved the solve rate 2.14% -> 9.27% and the training recipe only
    5.55% -> 6.46% (METHODS.md P4, in the project's docs/methods).
    """
    p = rates.mean(axis=2)
    return float((p.max(axis=1) - p.min(axis=1)).mean() - (p.max(axis=0) - p.min(axis=0)).mean())


def finding_table(rows: list[dict[str, Any]], plan: dict[str, Any], contrasts: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Rows of the ``eval_findings`` artifact, one per ``plan["findings"]`` entry, in plan order.

    ``contrast`` findings take the estimate and Bonferroni interval of their contrast's row
    (``n`` = its tasks). The spread finding resamples the tasks graded in every (checkpoint,
    harness) cell it covers, ``plan["bootstrap_resamples"]`` times with seed
    ``seed_from(plan["seed"], "finding", name)``, for a percentile interval at level
    ``1 - alpha / m`` (m: the number of findings, Bonferroni over the family). ``control_estimate``
    is the control contrast's estimate. ``verdict``/``reason`` by :func:`verdict`.
    """
    specs = plan.get("findings") or []
    m = max(len(specs), 1)
    level = 1.0 - plan["alpha"] / m
    by_name = {c["name"]: c for c in contrasts}
    rates = _task_rates(rows)
    out = []
    for f in specs:
        row: dict[str, Any] = {"name": f["name"], "paper": f["paper"], "headline": f["headline"],
                               "measure": f["measure"], "claim": f["claim"], "margin": f["margin"],
                               "contrast": f.get("contrast") or "", "control": f.get("control") or "",
                               "estimate": None, "ci_low": None, "ci_high": None, "n": 0, "control_estimate": None,
                               "level": None, "seed": None}
        if f.get("control"):
            row["control_estimate"] = by_name[f["control"]]["estimate"]
        if f["measure"] == "contrast":
            c = by_name[f["contrast"]]
            row.update(estimate=c["estimate"], ci_low=c["ci_low"], ci_high=c["ci_high"], n=c["n_tasks"],
                       level=1.0 - c["alpha"] / c["m_contrasts"], seed=c["seed"])
        else:
            cks = f.get("checkpoints") or [c["name"] for c in plan["checkpoints"]]
            hs = list(plan["harnesses"])
            cells = [[rates.get((ck, h), {}) for h in hs] for ck in cks]
            common = sorted(set.intersection(*[set(c) for cs in cells for c in cs])) if cells and hs else []
            seed = seed_from(plan["seed"], "finding", f["name"])
            row.update(level=level, seed=seed, n=len(common))
            if len(common) >= 2 and len(cks) >= 2 and len(hs) >= 2:
                arr = np.array([[[c[t] for t in common] for c in cs] for cs in cells])
                est = spread_gap(arr)
                rng = np.random.default_rng(seed)
                boot = np.array([spread_gap(arr[:, :, rng.integers(0, len(common), len(common))])
                                 for _ in range(int(plan["bootstrap_resamples"]))])
                a = (1.0 - level) / 2
                row.update(estimate=est, ci_low=float(np.quantile(boot, a)), ci_high=float(np.quantile(boot, 1 - a)))
        row["verdict"], row["reason"] = verdict(f["claim"], row["estimate"], row["ci_low"], row["ci_high"],
                                                f["margin"], row["control_estimate"])
        out.append(row)
    return out
