"""The papers' headlines as pre-registered findings: a measure, its interval, and a verdict by a
rule fixed before any attempt ran (docs/experiments/findings-rules.md).

Each finding is one of ``plan["findings"]`` (from ``evaluate.findings``, sealed in the plan and
the pre-registration). It is computed from the sealed rows and the contrast table only, with
seeded bootstraps, so :mod:`tasks.evaluate.verify` recomputes it from the files like every other
statistic of the evaluation. The verdict rule is the one the plan was sealed with
(``plan["findings_rule"]``: :data:`FINDINGS_RULE` for plans made now, 1 for plans made before
the key existed): :func:`verdict` (rule 1) or :func:`verdict_rule2` (the control's interval, and
no recipe comparison of single training seeds reproduced), through :func:`decide`.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from tasks.evaluate.stats import (arm_members, graded_counts, paired_bootstrap, pass_at_k, seed_task_bootstrap,
                                  training_seeds)
from tasks.hashing import seed_from

VERDICTS = ("reproduced", "not reproduced", "inconclusive")
#: the verdict rule a plan is sealed with now (``plan["findings_rule"]``); docs/experiments/findings-rules.md
#: says what changed from rule 1 (2026-12-07: the control's interval, and training seeds)
FINDINGS_RULE = 2


def verdict(claim: str, estimate: float | None, ci_low: float | None, ci_high: float | None, margin: float,
            control_estimate: float | None = None) -> tuple[str, str]:
    """``(verdict, reason)`` of one finding by the pre-registered rule (docs/experiments/findings-rules.md).

    - ``increase``: *reproduced* when the interval lies above 0 and, with a control, the
      control's estimate is below this estimate; *not reproduced* when the interval lies below
      ``margin`` (any effect is smaller than the smallest of interest; with margin 0: the effect
      is negative); else *inconclusive* (a positive interval whose control moved as much is
      inconclusive: the gain is not the reward's doing).
    - ``no_increase`` (a - b is at most ``margin``): *reproduced* when the interval's upper end is
      at most ``margin``; *not reproduced* when its lower end is above ``margin``; else
      *inconclusive*.

    - ``equivalent`` (a - b lies within ``[-margin, margin]``): *reproduced* when the whole
      interval does; *not reproduced* when the interval lies wholly above ``margin`` or wholly
      below ``-margin``; else *inconclusive*.

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
        return "inconclusive", (f"interval {iv} includes 0" + (f" and reaches the margin {margin:+.3f}" if margin > 0
                                                                else ""))
    if claim == "no_increase":
        if ci_high <= margin:
            return "reproduced", f"interval {iv} at most the margin {margin:+.3f}"
        if ci_low > margin:
            return "not reproduced", f"interval {iv} above the margin {margin:+.3f}"
        return "inconclusive", f"interval {iv} straddles the margin {margin:+.3f}"
    if claim == "equivalent":
        if -margin <= ci_low and ci_high <= margin:
            return "reproduced", f"interval {iv} within +/-{margin:.3f}"
        if ci_low > margin or ci_high < -margin:
            return "not reproduced", f"interval {iv} outside +/-{margin:.3f}"
        return "inconclusive", f"interval {iv} reaches beyond +/-{margin:.3f}"
    raise ValueError(f"finding claim {claim!r} is not 'increase', 'no_increase' or 'equivalent'")


def verdict_rule2(claim: str, estimate: float | None, ci_low: float | None, ci_high: float | None, margin: float,
                  control: tuple[float | None, float | None, float | None] | None = None,
                  single_seed: bool = False) -> tuple[str, str]:
    """``(verdict, reason)`` of one finding by rule 2 (docs/experiments/findings-rules.md).

    ``control``: None when the finding names no random-reward control, else the control
    contrast's ``(estimate, ci_low, ci_high)`` (Nones where it has none). ``single_seed``: the
    finding is a recipe comparison (its measure covers two or more trained arms) with an arm
    trained under one seed.

    As :func:`verdict`, except:

    - ``increase`` with a control is *reproduced* only when the control's estimate is below this
      estimate (rule 1) and the control's interval contains 0 or lies clearly below this one: its
      upper end is below this interval's lower end (the two intervals do not overlap). A control
      with no interval leaves the finding *inconclusive*.
    - a ``single_seed`` finding is never *reproduced* (the rule's *reproduced* becomes
      *inconclusive*, saying why): one training run per arm does not measure the variance between
      training runs that a comparison of recipes is about.

    Raises:
        ValueError: unknown ``claim``.
    """
    if claim == "increase" and control is not None and ci_low is not None and ci_high is not None and ci_low > 0:
        c_est, c_lo, c_hi = control
        iv = f"[{ci_low:+.3f}, {ci_high:+.3f}]"
        if c_est is None or c_lo is None or c_hi is None:
            v, why = "inconclusive", f"interval {iv} above 0, but the random-reward control has no estimate or interval"
        else:
            civ = f"{c_est:+.3f} [{c_lo:+.3f}, {c_hi:+.3f}]"
            if c_est >= estimate:  # type: ignore[operator]
                v, why = "inconclusive", (f"interval {iv} above 0, but the random-reward control moved as much "
                                          f"({civ}, estimate {estimate:+.3f})")
            elif c_lo <= 0 <= c_hi:
                v, why = "reproduced", f"interval {iv} above 0; the control's interval contains 0 ({civ})"
            elif c_hi < ci_low:
                v, why = "reproduced", f"interval {iv} above 0; the control's interval lies below it ({civ})"
            else:
                v, why = "inconclusive", (f"interval {iv} above 0, but the random-reward control's interval excludes 0 "
                                          f"and reaches this interval's lower end ({civ}): the gain is not shown to be "
                                          "the reward's doing")
    else:
        v, why = verdict(claim, estimate, ci_low, ci_high, margin)
    if v == "reproduced" and single_seed:
        v, why = "inconclusive", (f"{why}; but a recipe comparison with a single training seed per arm is never "
                                  "reproduced (train.seeds)")
    return v, why


def decide(row: dict[str, Any], rule: int) -> tuple[str, str]:
    """The verdict and reason of an ``eval_findings`` row (its ``claim``, ``estimate``,
    ``ci_low``, ``ci_high``, ``margin``, ``control``, ``control_estimate`` and, for rule 2,
    ``control_ci_low``, ``control_ci_high``, ``single_seed``) by the plan's verdict ``rule``.

    Raises:
        ValueError: an unknown rule or claim.
    """
    if rule == 1:
        return verdict(row["claim"], row["estimate"], row["ci_low"], row["ci_high"], row["margin"],
                       row["control_estimate"])
    if rule == 2:
        ctl = (row["control_estimate"], row["control_ci_low"], row["control_ci_high"]) if row["control"] else None
        return verdict_rule2(row["claim"], row["estimate"], row["ci_low"], row["ci_high"], row["margin"], ctl,
                             bool(row["single_seed"]))
    raise ValueError(f"plan findings_rule={rule!r} is not a verdict rule (1 or {FINDINGS_RULE})")


def spread_gap(rates: np.ndarray) -> float:
    """How much more the harness moves pass@1 than the checkpoint does.

    ``rates``: float ``[C, H, T]``, per checkpoint, evaluation harness and task the success rate.
    With P[c, h] the mean over tasks: the harness spread is the mean over checkpoints of
    ``max_h P - min_h P``, the recipe spread the mean over harnesses of ``max_c P - min_c P``;
    returns harness spread minus recipe spread (success-rate points). P4's headline: the
    evaluation harness moved the solve rate 2.14% -> 9.27% and the training recipe only
    5.55% -> 6.46% (P4: docs/methods/p4-within-cross.md).
    """
    p = rates.mean(axis=2)
    return float((p.max(axis=1) - p.min(axis=1)).mean() - (p.max(axis=0) - p.min(axis=0)).mean())


def _r2(x: np.ndarray, y: np.ndarray) -> float:
    """R^2 of the least-squares line of y on x (= Pearson r^2); NaN when x or y is constant."""
    if np.ptp(x) < 1e-12 or np.ptp(y) < 1e-12:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def predictor_gap(c: np.ndarray, m: np.ndarray, y: np.ndarray) -> float:
    """P1's claim as one number: R^2(C - M -> y) minus the better of R^2(C -> y) and R^2(M -> y).

    ``c``, ``m``, ``y``: float ``[n_cells]``, the ceiling, the mismatch and the target (gain or
    trained return) per cell. Positive: C - M predicts better than either component alone
    (P1: docs/methods/p1-ceiling-mismatch.md). NaN when any R^2 is undefined (a constant
    predictor or target)."""
    r = [_r2(c - m, y), _r2(c, y), _r2(m, y)]
    return float("nan") if any(np.isnan(r)) else r[0] - max(r[1], r[2])


def p1_cells(rows: list[dict[str, Any]], cells: list[dict[str, str]], k: int, reference: str = "base",
             members: Callable[[str], list[str]] | None = None,
             suite_of: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Per cell ``{checkpoint, harness}`` (optionally ``suite``): ``C`` (mean over the reference's
    tasks with >= k graded attempts of the unbiased pass@k under that harness), ``M`` = C - pass@1
    of the reference, ``gain`` = pass@1(checkpoint) - pass@1(reference) and ``return`` =
    pass@1(checkpoint), each pass@1 the mean over tasks of resolved / graded final attempts.
    ``members``: the checkpoints a cell's name stands for (an arm trained under several seeds: its
    seed checkpoints, whose pass@1 is averaged; None: the name itself). A cell with a ``suite``
    counts only the tasks ``suite_of`` (task id -> suite, the plan's) maps to it. Float arrays
    ``[len(cells)]``; NaN where a cell has no graded task.

    Raises:
        ValueError: a cell names a suite and ``suite_of`` is empty (the plan sealed no suites)."""
    counts = graded_counts(rows)

    def graded(ck: str, h: str, suite: str | None) -> list[tuple[int, int]]:
        return [v for t, v in counts.get((ck, h), {}).items() if suite is None or (suite_of or {}).get(t) == suite]

    cols: dict[str, list[float]] = {"C": [], "M": [], "gain": [], "return": []}
    for cell in cells:
        su = cell.get("suite")
        if su is not None and not suite_of:
            raise ValueError(f"p1 cell {cell!r} names suite {su!r}, but the plan has no suite_of")
        base = graded(reference, cell["harness"], su)
        trained = [graded(m, cell["harness"], su) for m in (members or (lambda n: [n]))(cell["checkpoint"])]
        ks = [pass_at_k(n, c, k) for n, c in base if n >= k]
        if not base or not all(trained) or not ks:
            for v in cols.values():
                v.append(float("nan"))
            continue
        p_base = float(np.mean([c / n for n, c in base]))
        p_trained = float(np.mean([np.mean([c / n for n, c in t]) for t in trained]))
        cc = float(np.mean(ks))
        cols["C"].append(cc)
        cols["M"].append(cc - p_base)
        cols["gain"].append(p_trained - p_base)
        cols["return"].append(p_trained)
    return {k_: np.array(v, dtype=float) for k_, v in cols.items()}


def pooled_rates(rates: dict[tuple[str, str], dict[str, float]], a_cells: list[dict[str, str]],
                 b_cells: list[dict[str, str]], tasks: set[str] | None = None
                 ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The tasks every cell graded (within ``tasks`` when given), sorted, and per task the mean
    success rate over the ``a_cells`` and over the ``b_cells``: two float ``[n_tasks]`` arrays,
    paired by task.

    ``rates``: ``(checkpoint, harness) -> {task_id: resolved / graded}``; a cell is
    ``{checkpoint, harness}``. No common task: an empty list and empty arrays."""
    cells = [rates.get((c["checkpoint"], c["harness"]), {}) for c in a_cells + b_cells]
    common = set.intersection(*[set(c) for c in cells]) if cells else set()
    common = sorted(common if tasks is None else common & tasks)
    na = len(a_cells)
    a = np.array([np.mean([c[t] for c in cells[:na]]) for t in common], dtype=np.float64)
    b = np.array([np.mean([c[t] for c in cells[na:]]) for t in common], dtype=np.float64)
    return common, a, b


def _covered(f: dict[str, Any], plan: dict[str, Any], contrast_of: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoints or seeded arms the measure of finding ``f`` covers, in order, without
    repeats (the control's not included)."""
    if f["measure"] == "contrast":
        c = contrast_of[f["contrast"]]
        names = [c["a"]["checkpoint"], c["b"]["checkpoint"]]
    elif f["measure"] == "p1_predictor_gap":
        names = [c["checkpoint"] for c in f["cells"]]
    elif f["measure"] == "pooled_contrast":
        names = [c["checkpoint"] for c in f["a_cells"] + f["b_cells"]]
    else:
        names = f.get("checkpoints") or default_checkpoints(plan)
    return list(dict.fromkeys(names))


def default_checkpoints(plan: dict[str, Any]) -> list[str]:
    """Every evaluated checkpoint in plan order, the seed checkpoints of an arm trained under
    several seeds standing as that arm (``plan["arm_seeds"]``)."""
    arm_of = {ck: arm for arm, cks in (plan.get("arm_seeds") or {}).items() for ck in cks}
    return list(dict.fromkeys(arm_of.get(c["name"], c["name"]) for c in plan["checkpoints"]))


def seed_fields(f: dict[str, Any], plan: dict[str, Any], contrast_of: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``seeds`` (JSON object: each trained arm the finding covers, its control's included, -> its
    training seeds; the base has none and is left out) and ``single_seed`` (a recipe comparison,
    whose measure covers two or more trained arms, with an arm of one seed) of finding ``f``."""
    measure = [n for n in _covered(f, plan, contrast_of) if training_seeds(plan, n) > 0]
    ctl = contrast_of[f["control"]] if f.get("control") else None
    arms = measure + ([n for n in (ctl["a"]["checkpoint"], ctl["b"]["checkpoint"]) if training_seeds(plan, n) > 0]
                      if ctl else [])
    seeds = {n: training_seeds(plan, n) for n in dict.fromkeys(arms)}
    return {"seeds": json.dumps(seeds, sort_keys=True),
            "single_seed": len(measure) >= 2 and any(seeds[n] < 2 for n in measure)}


def _seed_groups(rates: dict[tuple[str, str], dict[str, float]], plan: dict[str, Any], cells: list[dict[str, str]],
                 tasks: set[str] | None) -> tuple[list[str], list[np.ndarray], list[tuple[int, int]]]:
    """For cells ``{checkpoint, harness}`` whose checkpoint may be a seeded arm: the tasks every
    member cell graded (within ``tasks`` when given), sorted; per distinct checkpoint (a group,
    in order of first appearance) a float ``[S, K, T]`` array of its S seed checkpoints' success
    rates under its K cells' harnesses; and per cell its ``(group, k)`` place."""
    names: list[str] = []
    hs: dict[str, list[str]] = {}
    where = []
    for c in cells:
        g = c["checkpoint"]
        if g not in hs:
            names.append(g)
            hs[g] = []
        where.append((names.index(g), len(hs[g])))
        hs[g].append(c["harness"])
    per = [rates.get((m, h), {}) for g in names for m in arm_members(plan, g) for h in hs[g]]
    common = set.intersection(*[set(x) for x in per]) if per else set()
    ts = sorted(common if tasks is None else common & tasks)
    groups = [np.array([[[rates[(m, h)][t] for t in ts] for h in hs[g]] for m in arm_members(plan, g)],
                       dtype=np.float64) for g in names]
    return ts, groups, where


def finding_table(rows: list[dict[str, Any]], plan: dict[str, Any], contrasts: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Rows of the ``eval_findings`` artifact, one per ``plan["findings"]`` entry, in plan order.

    ``contrast`` findings take the estimate and Bonferroni interval of their contrast's row
    (``n`` = its tasks). ``p1_predictor_gap`` (:func:`predictor_gap` over :func:`p1_cells`, ``n`` =
    cells with graded tasks) resamples the cells, with the same seed rule and level; resamples
    where an R^2 is undefined are left out, and with fewer than half of them defined there is no
    interval. The spread finding resamples the tasks graded in every (checkpoint,
    harness) cell it covers, ``plan["bootstrap_resamples"]`` times with seed
    ``seed_from(plan["seed"], "finding", name)``, for a percentile interval at level
    ``1 - alpha / m`` (m: the number of findings, Bonferroni over the family); so does
    ``pooled_contrast`` (:func:`pooled_rates`; at least 2 common tasks). Where a checkpoint the
    spread or pooled measure covers is an arm trained under several seeds (``plan["arm_seeds"]``),
    its success rate on a task is the mean over its seeds and the interval resamples the seeds,
    then the tasks (:func:`tasks.evaluate.stats.seed_task_bootstrap`); otherwise the draws are
    exactly those made before seeds existed. ``control_estimate`` is the control contrast's
    estimate.

    The verdict (:func:`decide`) follows the plan's ``findings_rule`` (absent: 1). A rule-2 plan's
    rows also carry ``control_ci_low`` / ``control_ci_high`` (the control contrast's interval, the
    same bootstrap), ``seeds`` and ``single_seed`` (:func:`seed_fields`) and ``interval``
    (``task``, ``seed-task`` or ``cell``); a rule-1 plan's rows are those of ``eval_findings`` v1.
    """
    specs = plan.get("findings") or []
    rule = int(plan.get("findings_rule", 1))
    m = max(len(specs), 1)
    level = 1.0 - plan["alpha"] / m
    by_name = {c["name"]: c for c in contrasts}
    contrast_of = {c["name"]: c for c in plan.get("contrasts") or []}
    rates = {key: {t: c / n for t, (n, c) in tasks.items()} for key, tasks in graded_counts(rows).items()}
    out = []
    for f in specs:
        row: dict[str, Any] = {"name": f["name"], "paper": f["paper"], "headline": f["headline"],
                               "measure": f["measure"], "claim": f["claim"], "margin": f["margin"],
                               "contrast": f.get("contrast") or "", "control": f.get("control") or "",
                               "estimate": None, "ci_low": None, "ci_high": None, "n": 0, "control_estimate": None,
                               "level": None, "seed": None}
        seeded = any(len(arm_members(plan, n)) > 1 for n in _covered(f, plan, contrast_of))
        interval = "seed-task" if seeded else "task"
        if f.get("control"):
            row["control_estimate"] = by_name[f["control"]]["estimate"]
        if f["measure"] == "contrast":
            c = by_name[f["contrast"]]
            row.update(estimate=c["estimate"], ci_low=c["ci_low"], ci_high=c["ci_high"], n=c["n_tasks"],
                       level=1.0 - c["alpha"] / c["m_contrasts"], seed=c["seed"])
        elif f["measure"] == "p1_predictor_gap":
            interval = "cell"
            seed = seed_from(plan["seed"], "finding", f["name"])
            pts = p1_cells(rows, f["cells"], int(plan["attempts"]), members=lambda n: arm_members(plan, n),
                           suite_of=plan.get("suite_of"))
            ok = ~np.isnan(pts["C"])
            c_, m_, y_ = pts["C"][ok], pts["M"][ok], pts[f.get("target", "gain")][ok]
            row.update(level=level, seed=seed, n=int(ok.sum()))
            est = predictor_gap(c_, m_, y_) if len(c_) >= 3 else float("nan")
            if not np.isnan(est):
                rng = np.random.default_rng(seed)
                boot = []
                for _ in range(int(plan["bootstrap_resamples"])):
                    i = rng.integers(0, len(c_), len(c_))
                    g = predictor_gap(c_[i], m_[i], y_[i])
                    if not np.isnan(g):
                        boot.append(g)
                # most resamples of few cells repeat a cell until a predictor is constant: then no interval
                if len(boot) >= int(plan["bootstrap_resamples"]) // 2:
                    a = (1.0 - level) / 2
                    row.update(estimate=est, ci_low=float(np.quantile(boot, a)), ci_high=float(np.quantile(boot, 1 - a)))
                else:
                    row.update(estimate=est)
        elif f["measure"] == "pooled_contrast":
            seed = seed_from(plan["seed"], "finding", f["name"])
            only = {t for t, s_ in plan["suite_of"].items() if s_ == f["suite"]} if f.get("suite") else None
            if seeded:
                common, groups, where = _seed_groups(rates, plan, f["a_cells"] + f["b_cells"], only)
                na = len(f["a_cells"])

                def pooled(ms: list[np.ndarray], _w: list[tuple[int, int]] = where, _na: int = na) -> float:
                    a_ = np.mean([ms[g][k] for g, k in _w[:_na]], axis=0)
                    b_ = np.mean([ms[g][k] for g, k in _w[_na:]], axis=0)
                    return float((a_ - b_).mean())
            else:
                common, pa, pb = pooled_rates(rates, f["a_cells"], f["b_cells"], only)
            row.update(level=level, seed=seed, n=len(common))
            if len(common) >= 2:  # the contrasts' task-clustered paired bootstrap, at the findings' level
                if seeded:
                    est, lo, hi, _ = seed_task_bootstrap(groups, pooled, int(plan["bootstrap_resamples"]), seed, level)
                else:
                    est, lo, hi, _ = paired_bootstrap(pa, pb, int(plan["bootstrap_resamples"]), seed, level)
                row.update(estimate=est, ci_low=lo, ci_high=hi)
        else:
            cks = f.get("checkpoints") or default_checkpoints(plan)
            hs = list(plan["harnesses"])
            seed = seed_from(plan["seed"], "finding", f["name"])
            if seeded:
                common, groups, _ = _seed_groups(rates, plan, [{"checkpoint": ck, "harness": h} for ck in cks
                                                               for h in hs], None)
            else:
                cells = [[rates.get((ck, h), {}) for h in hs] for ck in cks]
                common = sorted(set.intersection(*[set(c) for cs in cells for c in cs])) if cells and hs else []
            row.update(level=level, seed=seed, n=len(common))
            if len(common) >= 2 and len(cks) >= 2 and len(hs) >= 2:
                a = (1.0 - level) / 2
                if seeded:  # each group is one checkpoint's [seeds, harnesses, tasks]
                    est, lo, hi, _ = seed_task_bootstrap(groups, lambda ms: spread_gap(np.stack(ms)),
                                                         int(plan["bootstrap_resamples"]), seed, level)
                    row.update(estimate=est, ci_low=lo, ci_high=hi)
                else:
                    arr = np.array([[[c[t] for t in common] for c in cs] for cs in cells])
                    est = spread_gap(arr)
                    rng = np.random.default_rng(seed)
                    boot = np.array([spread_gap(arr[:, :, rng.integers(0, len(common), len(common))])
                                     for _ in range(int(plan["bootstrap_resamples"]))])
                    row.update(estimate=est, ci_low=float(np.quantile(boot, a)), ci_high=float(np.quantile(boot, 1 - a)))
        if rule >= 2:
            ctl = by_name[f["control"]] if f.get("control") else None
            row.update(control_ci_low=ctl["ci_low"] if ctl else None, control_ci_high=ctl["ci_high"] if ctl else None,
                       interval=by_name[f["contrast"]]["interval"] if f["measure"] == "contrast" else interval,
                       **seed_fields(f, plan, contrast_of))
        row["verdict"], row["reason"] = decide(row, rule)
        out.append(row)
    return out
