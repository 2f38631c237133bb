"""P2's claims computed from the sealed rows and the plan (pure; the run and ``harnessrl verify``
both call these, so the table a run writes is the table verify recomputes).

Inputs: ``plan`` (:func:`tasks.bipa.sealed_run.build_plan`) and the sealed rows, of two kinds:
``candidate`` (name, arm, opt_seed, round, parent, harness_id or None for an empty rewrite) and
``episode`` (score_set, harness_id, task_id, sample, reward, input_tokens, turns).

- Per (set, harness, task): the mean over samples of the reward, the input tokens and the turns.
- **Decisions** (:func:`decisions`): a pool edit or the placebo is accepted when its selection
  mean beats the seed's by more than ``accept.better_by`` (each against the seed); a rewrite is
  accepted when it beats its parent (the incumbent of its optimizer seed), then becomes the
  incumbent. The *learned* skill of a rewrite seed is its last incumbent; of the pool, the
  accepted hand-written edit with the highest selection mean (the first in plan order on a tie).
- **Gain** of a candidate on a set: per task, its score minus its parent's (the seed's for the
  pool and the placebo). Common random numbers make the two share sampler noise per (task, sample).
- **Findings** (:func:`finding_table`), each interval at level ``1 - alpha / m`` (Bonferroni over
  the m rules), verdict by rule 2 of docs/experiments/findings-rules.md:
  ``learned_minus_seed`` / ``input_tokens`` / ``turns``: mean over tasks (and, for the rewrite
  arm, over optimizer seeds) of learned minus seed on the test tasks; the interval a seed-task
  bootstrap (:func:`tasks.evaluate.stats.seed_task_bootstrap`; the pool is one "seed").
  ``selection_effect``: over the accepted candidates of both arms except the placebo, the mean
  of (gain at selection - gain on ``score_set``), with the task bootstrap of
  :func:`tasks.bipa.replay.selection_effect` (selection and fresh tasks drawn together, test
  tasks apart); its control is the placebo's own (gain at selection - gain on the set), accepted
  or not: what the sets differ by without selection.
  A value undefined on the data (no accepted candidate; every optimizer seed kept the seed) has
  no estimate, and its reason starts with ``n/a:``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tasks.hashing import seed_from

SETS = ("selection", "fresh", "test")
METRICS = ("reward", "input_tokens", "turns")


def cell_means(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """``{(set, harness_id, metric): {task_id: mean over samples}}`` from the episode rows
    (metric in :data:`METRICS`; fsum means, so the order of rows does not matter)."""
    acc: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in rows:
        if r["kind"] != "episode":
            continue
        for m in METRICS:
            acc.setdefault((r["score_set"], r["harness_id"], m), {}).setdefault(r["task_id"], []).append(float(r[m]))
    return {k: {t: math.fsum(v) / len(v) for t, v in sorted(d.items())} for k, d in acc.items()}


def _mean(d: dict[str, float]) -> float:
    return math.fsum(d.values()) / len(d)


def decisions(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates in sealing order, each ``{name, arm, opt_seed, round, parent, harness_id,
    parent_harness_id, selection_mean, parent_mean, decision}`` (decision ``seed``, ``accepted``,
    ``rejected`` or ``invalid`` for an empty rewrite), by the plan's rule on the selection rows.

    Raises:
        KeyError: a scored candidate or its parent has no selection rows.
    """
    from tasks.bipa.replay import AcceptRule

    rule = AcceptRule(**plan["accept"])
    cells = cell_means(rows)
    by_name: dict[str, dict[str, Any]] = {}
    out = []
    for r in rows:
        if r["kind"] != "candidate":
            continue
        c = {k: r[k] for k in ("name", "arm", "opt_seed", "round", "parent", "harness_id")}
        par = by_name.get(r["parent"]) if r["parent"] else None
        c["parent_harness_id"] = par["harness_id"] if par else None
        c["selection_mean"] = c["parent_mean"] = None
        if c["arm"] == "seed":
            c["decision"] = "seed"
        elif c["harness_id"] is None:
            c["decision"] = "invalid"
        else:
            c["selection_mean"] = _mean(cells[("selection", c["harness_id"], "reward")])
            c["parent_mean"] = _mean(cells[("selection", c["parent_harness_id"], "reward")])
            c["decision"] = "accepted" if rule.accepts(c["selection_mean"], c["parent_mean"]) else "rejected"
        by_name[c["name"]] = c
        out.append(c)
    return out


def incumbent(cands: list[dict[str, Any]], opt_seed: int) -> dict[str, Any]:
    """The incumbent of optimizer seed ``opt_seed`` after the candidates so far: its last accepted
    rewrite, else the seed."""
    inc = next(c for c in cands if c["arm"] == "seed")
    for c in cands:
        if c["arm"] == "rewrite" and c["opt_seed"] == opt_seed and c["decision"] == "accepted":
            inc = c
    return inc


def learned(cands: list[dict[str, Any]], arm: str, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The learned skill per optimizer seed (``rewrite``: one per plan seed, in order) or the
    pool's one (``pool``) (module docstring)."""
    if arm == "rewrite":
        return [incumbent(cands, s) for s in plan["rewrite"]["seeds"]]
    acc = [c for c in cands if c["arm"] == "pool" and c["decision"] == "accepted"]
    seed = next(c for c in cands if c["arm"] == "seed")
    return [max(acc, key=lambda c: c["selection_mean"]) if acc else seed]  # max keeps the first on a tie


def gain(cells: dict, c: dict[str, Any], score_set: str) -> dict[str, float]:
    """Per task of ``score_set``: the candidate's mean reward minus its parent's."""
    a = cells[(score_set, c["harness_id"], "reward")]
    b = cells[(score_set, c["parent_harness_id"], "reward")]
    return {t: a[t] - b[t] for t in a}


def _learned_row(f: dict[str, Any], plan: dict[str, Any], cands: list[dict[str, Any]], cells: dict, level: float,
                 resamples: int, seed: int) -> dict[str, Any]:
    from tasks.evaluate.stats import seed_task_bootstrap

    metric = {"learned_minus_seed": "reward", "input_tokens": "input_tokens", "turns": "turns"}[f["measure"]]
    ls = learned(cands, f["arm"], plan)
    base = next(c for c in cands if c["arm"] == "seed")
    tasks = sorted(cells[("test", base["harness_id"], metric)])
    out = {"n": len(tasks), "optimizer_seeds": len(ls) if f["arm"] == "rewrite" else None,
           "learned": [c["name"] for c in ls], "interval": "seed-task" if f["arm"] == "rewrite" else "task"}
    if all(c["arm"] == "seed" for c in ls):
        why = ("every optimizer seed kept the seed skill (no rewrite was accepted)" if f["arm"] == "rewrite" else
               "no hand-written edit was accepted, so the pool learned nothing")
        return {**out, "estimate": None, "ci_low": None, "ci_high": None, "na_reason": why}
    g_learned = np.array([[cells[("test", c["harness_id"], metric)][t] for t in tasks] for c in ls])  # [S, T]
    g_seed = np.array([[cells[("test", base["harness_id"], metric)][t] for t in tasks]])  # [1, T]
    est, lo, hi, _ = seed_task_bootstrap([g_learned, g_seed], lambda g: float(np.mean(g[0] - g[1])), resamples,
                                         seed, level)
    return {**out, "estimate": float(est), "ci_low": float(lo), "ci_high": float(hi), "na_reason": None}


def _effect_row(f: dict[str, Any], cands: list[dict[str, Any]], cells: dict, level: float, resamples: int,
                seed: int) -> dict[str, Any]:
    from tasks.bipa.replay import selection_effect

    s = f["score_set"]
    paired = s == "fresh"
    acc = [c for c in cands if c["decision"] == "accepted" and c["arm"] != "placebo"]
    plac = next(c for c in cands if c["arm"] == "placebo")
    c_est, c_lo, c_hi = selection_effect([gain(cells, plac, "selection")], [gain(cells, plac, s)], paired=paired,
                                         bootstrap=resamples, seed=seed, level=level)
    out = {"n": len(gain(cells, plac, s)), "n_candidates": len(acc), "optimizer_seeds": None,
           "learned": [c["name"] for c in acc], "interval": "task", "control": c_est, "control_ci_low": c_lo,
           "control_ci_high": c_hi}
    if not acc:
        return {**out, "estimate": None, "ci_low": None, "ci_high": None,
                "na_reason": "no candidate other than the placebo was accepted at selection"}
    est, lo, hi = selection_effect([gain(cells, c, "selection") for c in acc], [gain(cells, c, s) for c in acc],
                                   paired=paired, bootstrap=resamples, seed=seed, level=level)
    return {**out, "estimate": est, "ci_low": lo, "ci_high": hi, "na_reason": None}


def finding_table(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of ``bipa_findings``, one per plan rule in order (module docstring): ``name``,
    ``paper`` (P2), ``headline``, ``measure``, ``arm``, ``score_set``, ``claim``, ``margin``,
    ``estimate``, ``ci_low``, ``ci_high`` (None where n/a), ``level``, ``n`` (tasks),
    ``n_candidates``, ``optimizer_seeds``, ``learned`` (JSON list of candidate names),
    ``interval``, ``control`` / ``control_ci_low`` / ``control_ci_high`` (the placebo, for a
    selection effect), ``seed``, ``rule`` (2), ``verdict``, ``reason``."""
    import json

    from tasks.evaluate.findings import verdict_rule2

    f_all = plan["findings"]
    rules = f_all["rules"]
    level = 1.0 - f_all["alpha"] / len(rules)
    cands = decisions(plan, rows)
    cells = cell_means(rows)
    out = []
    for f in rules:
        s = seed_from(f_all["seed"], "finding", f["name"]) % 2**31
        if f["measure"] == "selection_effect":
            r = _effect_row(f, cands, cells, level, f_all["bootstrap_resamples"], s)
        else:
            r = _learned_row(f, plan, cands, cells, level, f_all["bootstrap_resamples"], s)
        control = (r.get("control"), r.get("control_ci_low"), r.get("control_ci_high")) if "control" in r else None
        if r["na_reason"]:
            v, why = "inconclusive", f"n/a: {r['na_reason']}"
        else:
            v, why = verdict_rule2(f["claim"], r["estimate"], r["ci_low"], r["ci_high"], f["margin"], control)
        out.append({"name": f["name"], "paper": "P2", "headline": f["headline"], "measure": f["measure"],
                    "arm": f["arm"], "score_set": f.get("score_set"), "claim": f["claim"], "margin": f["margin"],
                    "estimate": r["estimate"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "level": level,
                    "n": r["n"], "n_candidates": r.get("n_candidates"), "optimizer_seeds": r["optimizer_seeds"],
                    "learned": json.dumps(r["learned"]), "interval": r["interval"], "control": r.get("control"),
                    "control_ci_low": r.get("control_ci_low"), "control_ci_high": r.get("control_ci_high"),
                    "seed": s, "rule": 2, "verdict": v, "reason": why})
    return out


def gain_rows(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of ``bipa_gains`` (descriptive): per scored candidate other than the seed, its
    decision and its mean gain over its parent on each set, and the per-episode input tokens and
    turns minus its parent's on the test tasks. The placebo's row is the null's figure."""
    cands = decisions(plan, rows)
    cells = cell_means(rows)
    out = []
    for c in cands:
        if c["arm"] == "seed" or c["harness_id"] is None:
            continue
        row = {k: c[k] for k in ("name", "arm", "opt_seed", "round", "parent", "decision")}
        for s in SETS:
            row[f"gain_{s}"] = _mean(gain(cells, c, s))
        for m in ("input_tokens", "turns"):
            a, b = cells[("test", c["harness_id"], m)], cells[("test", c["parent_harness_id"], m)]
            row[f"{m}_test"] = math.fsum(a[t] - b[t] for t in a) / len(a)
        out.append(row)
    return out
