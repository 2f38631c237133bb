"""Per-arm summaries for experiments with several training arms (docs/methods/p5-kl.md, docs/methods/p6-gspo-lora.md).

- :func:`suite_pass_rates`: sealed pass@1 per (checkpoint, harness, suite) with a task-resampling
  bootstrap interval, and the median number of agent steps (turns) per graded attempt, so in-domain
  and out-of-domain suites, and steps before and after training, read side by side.
- :func:`training_stability`: per arm, the last and largest KL and whether training stayed
  finite, below a divergence threshold and (by the pre-registered rule) without a reward
  collapse or a gradient norm leaving its band.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from tasks.analysis.ceiling import task_outcomes
from tasks.evaluate.stats import GRADED, final_attempts


def suite_pass_rates(evaluations: list[dict[str, Any]], suite_of: dict[str, str], *, resamples: int, seed: int,
                     level: float = 0.95) -> list[dict[str, Any]]:
    """Rows ``checkpoint, harness_name, suite, n_tasks, graded, pass_at_1, ci_low, ci_high,
    median_turns``, sorted by (checkpoint, harness, suite).

    pass@1 = mean over tasks of the task's fraction of resolved graded attempts (final outcome of
    each planned attempt; infra errors out of the denominators, timeouts failures), as in
    ``eval_cells``. Interval: percentile bootstrap at ``level`` over tasks (``resamples`` draws
    with replacement of the cell's tasks, numpy Generator seeded with ``seed``), i.e. sampling
    error over tasks only. ``median_turns``: median ``num_turns`` (agent steps) over the cell's
    graded final attempts (P6 reports the median number of agent steps before and after).
    A cell with no graded attempt has null rates.

    Args:
        suite_of: task_id -> suite name (the ``tasks`` artifact's ``suite`` column).

    Raises:
        ValueError: ``resamples`` < 1, ``level`` outside (0, 1), a task missing from ``suite_of``,
            or a malformed evaluation row (see :func:`tasks.analysis.ceiling.check_evaluation_rows`).
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    outcomes = task_outcomes(evaluations)
    missing = sorted({r["task_id"] for r in evaluations} - set(suite_of))
    if missing:
        raise ValueError(f"task {missing[0]!r} of the evaluations is not in the tasks artifact ({len(missing)} missing)")
    turns: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for r in final_attempts(evaluations).values():
        if r["status"] in GRADED:
            turns[(r["checkpoint"], r["harness_name"], suite_of[r["task_id"]])].append(int(r["num_turns"]))
    rng = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    rows = []
    for (ck, h), tasks in sorted(outcomes.items()):
        by_suite: dict[str, list[float]] = defaultdict(list)
        n_by_suite: dict[str, int] = defaultdict(int)
        for t, (n, c, _infra) in sorted(tasks.items()):
            n_by_suite[suite_of[t]] += 1
            if n:
                by_suite[suite_of[t]].append(c / n)
        for suite in sorted(n_by_suite):
            rates = np.asarray(by_suite.get(suite, []), dtype=np.float64)
            row: dict[str, Any] = {"checkpoint": ck, "harness_name": h, "suite": suite, "n_tasks": n_by_suite[suite],
                                   "graded": len(turns.get((ck, h, suite), [])), "pass_at_1": None, "ci_low": None,
                                   "ci_high": None, "median_turns": None}
            if rates.size:
                boot = rates[rng.integers(0, rates.size, size=(resamples, rates.size))].mean(axis=1)
                lo, hi = np.quantile(boot, [tail, 1.0 - tail])
                row.update(pass_at_1=float(rates.mean()), ci_low=float(lo), ci_high=float(hi),
                           median_turns=float(statistics.median(turns[(ck, h, suite)])))
            rows.append(row)
    return rows


def nonfinite_step(row: dict[str, Any]) -> bool:
    """True when a ``train_steps`` row's loss or gradient norm is NaN/inf, or its KL is infinite.
    A NaN KL alone is not instability: the trainer writes NaN where no KL is computed (beta 0)."""
    return (not all(math.isfinite(row[c]) for c in ("loss", "grad_norm"))) or math.isinf(row["kl"])


def training_stability(steps: list[dict[str, Any]], divergence_kl: float,
                       rule: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows ``arm, steps, first_reward, final_reward, final_kl, max_kl, nonfinite_steps,
    early_reward, late_reward, early_grad_norm, max_grad_norm, stable, reason`` per training arm
    (the ``arm`` column of ``train_steps``; ``final`` when absent), in order of first appearance.

    An arm is unstable when any step's loss or gradient norm is not finite (NaN/inf) or its KL is
    infinite (:func:`nonfinite_step`; a NaN KL means not computed, beta 0), or its
    per-token KL (nats, the configured estimator) exceeds ``divergence_kl`` at any step. With
    ``rule`` (``analyze.stability``: ``window`` w, ``reward_collapse`` f, ``grad_norm_factor``
    g), also when the mean reward of the last w steps (``late_reward``) is below f times that of
    the first w (``early_reward``; a collapse, judged only when the early mean is above 0), or any
    finite gradient norm exceeds g times the median of the first w steps' (``early_grad_norm``).
    ``reason`` says which rules fired (empty when stable). Without ``rule`` the window is 1.
    """
    w = int(rule["window"]) if rule else 1
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by[s.get("arm") or "final"].append(s)
    out = []
    for arm in by:
        rs = sorted(by[arm], key=lambda r: r["step"])
        bad = [r["step"] for r in rs if nonfinite_step(r)]
        kls = [r["kl"] for r in rs if math.isfinite(r["kl"])]
        gns = [r["grad_norm"] for r in rs if math.isfinite(r["grad_norm"])]
        early_gn = [r["grad_norm"] for r in rs[:w] if math.isfinite(r["grad_norm"])]
        max_kl = max(kls, default=None)
        early = float(np.mean([r["reward_mean"] for r in rs[:w]]))
        late = float(np.mean([r["reward_mean"] for r in rs[-w:]]))
        early_g = float(statistics.median(early_gn)) if early_gn else None
        max_g = max(gns, default=None)
        reasons = []
        if bad:
            reasons.append(f"non-finite loss/KL/grad norm at step(s) {bad[:5]}")
        if max_kl is not None and max_kl > divergence_kl:
            reasons.append(f"KL {max_kl:.3g} > {divergence_kl:g} nats/token")
        if rule and len(rs) > w and early > 0 and late < rule["reward_collapse"] * early:
            reasons.append(f"reward collapsed: last {w} steps {late:.3f} < {rule['reward_collapse']:g} x first {w} "
                           f"{early:.3f}")
        if rule and early_g and max_g is not None and max_g > rule["grad_norm_factor"] * early_g:
            reasons.append(f"grad norm {max_g:.3g} > {rule['grad_norm_factor']:g} x early median {early_g:.3g}")
        out.append({"arm": arm, "steps": len(rs), "first_reward": rs[0]["reward_mean"],
                    "final_reward": rs[-1]["reward_mean"], "final_kl": rs[-1]["kl"], "max_kl": max_kl,
                    "nonfinite_steps": len(bad), "early_reward": early, "late_reward": late,
                    "early_grad_norm": early_g, "max_grad_norm": max_g, "stable": not reasons,
                    "reason": "; ".join(reasons)})
    return out


def choose_kl_beta(steps: list[dict[str, Any]], beta_of: dict[str, float], anchor: str, *, last: int = 3,
                   ratio: float = 0.5, min_anchor_kl: float = 0.0) -> dict[str, Any]:
    """P5's beta by the rule fixed before the pilot (docs/experiments/findings-rules.md, "Choosing
    P5's beta"): per arm (a checkpoint) L = the mean per-token KL (nats, the ``kl`` column) over
    its last ``last`` steps, and per beta L(beta) = the mean of its arms' L (an arm trained under
    several seeds: one checkpoint per seed). The chosen beta is the smallest candidate (every beta
    but the anchor's) with L(beta) <= ``ratio`` x L(anchor beta) (the anchor trains at a negligible
    beta, so its L is the drift without the term), else the largest candidate. The rule is met
    only when the anchor drifted measurably, L(anchor beta) >= ``min_anchor_kl``: below it no beta
    can be said to hold the policy, and the largest candidate is returned with ``rule_met`` False.

    Args:
        steps: ``train_steps`` rows (``arm``, ``step``, ``kl``).
        beta_of: arm (checkpoint) name -> its beta.
        anchor: an arm at the negligible beta (every arm at its beta is averaged with it).
        last: steps per arm averaged, >= 1.
        ratio: the fraction of the anchor's drift a chosen beta must keep the policy within.
        min_anchor_kl: the least anchor drift (nats per token) at which the rule can be met.

    Returns:
        ``{"beta", "rule_met", "anchor_drifted", "late_kl": {arm: L}, "beta_kl": {beta: L(beta)},
        "held": {candidate beta: L(beta) / L(anchor beta)}, "anchor_kl"}`` (``held`` None where the
        anchor's L is 0).

    Raises:
        ValueError: an arm of ``beta_of`` with no step, fewer than ``last`` steps, or a non-finite KL
            in its last ``last`` steps (the KL was not measured: beta 0); no candidate.
    """
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by[s.get("arm") or "final"].append(s)
    late: dict[str, float] = {}
    for arm in beta_of:
        rs = sorted(by.get(arm, []), key=lambda r: r["step"])[-last:]
        if len(rs) < last or not all(math.isfinite(r["kl"]) for r in rs):
            raise ValueError(f"arm {arm!r}: needs {last} steps with a measured KL, has "
                             f"{sum(math.isfinite(r['kl']) for r in rs)}")
        late[arm] = float(np.mean([r["kl"] for r in rs]))
    per_beta: dict[float, list[float]] = defaultdict(list)
    for arm, b in beta_of.items():
        per_beta[b].append(late[arm])
    beta_kl = {b: float(np.mean(v)) for b, v in sorted(per_beta.items())}
    a_beta = beta_of[anchor]
    candidates = [b for b in beta_kl if b != a_beta]
    if not candidates:
        raise ValueError("no candidate beta besides the anchor's")
    a_kl = beta_kl[a_beta]
    drifted = a_kl >= min_anchor_kl
    met = [b for b in candidates if beta_kl[b] <= ratio * a_kl] if drifted else []
    return {"beta": met[0] if met else candidates[-1], "rule_met": bool(met), "anchor_drifted": drifted,
            "late_kl": late, "beta_kl": beta_kl, "held": {b: (beta_kl[b] / a_kl if a_kl > 0 else None)
                                                          for b in candidates},
            "anchor_kl": a_kl}
