"""Evaluation statistics: unbiased pass@k, the checkpoint x harness matrix of a sealed
evaluation, task-clustered paired bootstrap CIs for pre-registered contrasts with Bonferroni
correction, and the minimum detectable difference (P4: docs/methods/p4-within-cross.md)."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Callable

import numpy as np

from tasks.hashing import seed_from


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` attempts of which ``c`` passed (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", arXiv 2107.03374, eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k)

    computed as a running product for numerical stability.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean(values: list[float]) -> float:
    """Arithmetic mean; NaN for an empty list."""
    return math.fsum(values) / len(values) if values else float("nan")


# ---- sealed-evaluation statistics ------------------------------------------------------------

GRADED = ("resolved", "unresolved", "timeout")  # timeout = a graded failure; infra_error is not graded


def final_attempts(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """The outcome of every planned attempt: for each (checkpoint, harness_name, record_id,
    attempt) the row with the highest ``retry`` (a retry of an infra_error replaces it as the
    attempt's outcome; the original stays in the chain). Rows need ``checkpoint``,
    ``harness_name``, ``record_id``, ``attempt``, ``retry``."""
    out: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["checkpoint"], r["harness_name"], r["record_id"], r["attempt"])
        if key not in out or r["retry"] > out[key]["retry"]:
            out[key] = r
    return out


def attempts_by_cell_and_task(finals: dict[tuple[str, str, str, int], dict[str, Any]]
                              ) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """The final attempts (:func:`final_attempts`) per (checkpoint, harness_name) cell, per task:
    ``{(checkpoint, harness_name): {task_id: [row, ...]}}``, rows in the order given."""
    cells: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for (ck, h, _rid, _a), r in finals.items():
        cells.setdefault((ck, h), {}).setdefault(r["task_id"], []).append(r)
    return cells


def graded_counts(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, tuple[int, int]]]:
    """Per (checkpoint, harness_name), per task: ``(graded, resolved)`` over the final outcome of
    each planned attempt (:func:`final_attempts`); tasks with no graded attempt are left out. A
    task's success rate is ``resolved / graded``."""
    out: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    for key, tasks in attempts_by_cell_and_task(final_attempts(rows)).items():
        for t, rs in tasks.items():
            g = [r for r in rs if r["status"] in GRADED]
            if g:
                out.setdefault(key, {})[t] = (len(g), sum(r["resolved"] for r in g))
    return out


def cell_table(rows: list[dict[str, Any]], plan: dict[str, Any], min_graded_fraction: float) -> list[dict[str, Any]]:
    """Rows of the ``eval_cells`` artifact (schemas/contracts.py): the checkpoint x harness matrix.

    Per (checkpoint, harness) cell, over each planned attempt's final outcome
    (:func:`final_attempts`): ``graded`` = resolved + unresolved + timeout, ``infra_errors``
    left out of every denominator and reported apart, ``graded_fraction`` = graded / planned,
    ``counted`` = graded_fraction >= ``min_graded_fraction`` (P4, docs/methods/p4-within-cross.md: 95%). For a counted
    cell: ``pass_at_1`` = mean over tasks of c/n (the unbiased pass@1), ``pass_at_k`` = mean over
    tasks with >= k graded attempts of :func:`pass_at_k` (k = the plan's attempts), ``avg_at_k``
    = mean over tasks of the mean reward of the graded attempts (= pass@1 for binary rewards),
    ``parse_rate`` = the share of graded attempts whose answer was in the harness's own format
    (``answer_parsed``: its answer pattern or submit tool, not the last-number fallback) and
    ``acc_given_parsed`` = the resolved share of those (None when none parsed), so that a gain can
    be read as format (parse rate up) or competence (accuracy given parsed up).
    ``row_mean`` rows (harness ``*``) average a checkpoint's counted cells, ``col_mean`` rows
    (checkpoint ``*``) a harness's; None where no cell counts.

    Args:
        rows: sealed evaluation rows (``status``, ``resolved``, ``reward``, ``task_id``, ...).
        plan: the evaluation plan (``records``, ``checkpoints``, ``attempts``, ``held_out``).
        min_graded_fraction: in (0, 1].

    Raises:
        ValueError: ``min_graded_fraction`` outside (0, 1].
    """
    if not (0.0 < min_graded_fraction <= 1.0):
        raise ValueError(f"min_graded_fraction must be in (0, 1], got {min_graded_fraction}")
    k = int(plan["attempts"])
    held = set(plan.get("held_out", []))
    tasks_per_h: dict[str, int] = {}
    for rec in plan["records"]:
        tasks_per_h[rec["harness_name"]] = tasks_per_h.get(rec["harness_name"], 0) + 1
    per = attempts_by_cell_and_task(final_attempts(rows))
    out = []
    for ck in plan["checkpoints"]:
        for h in plan["harnesses"]:
            tasks = per.get((ck["name"], h), {})
            flat = [r for rs in tasks.values() for r in rs]
            infra = sum(r["status"] == "infra_error" for r in flat)
            timeouts = sum(r["status"] == "timeout" for r in flat)
            planned = tasks_per_h.get(h, 0) * k
            graded = sum(r["status"] in GRADED for r in flat)
            frac = graded / planned if planned else 0.0
            counted = planned > 0 and frac >= min_graded_fraction
            p1 = pk = avg = parse = acc_parsed = None
            if counted:
                g = [[r for r in rs if r["status"] in GRADED] for rs in tasks.values()]
                g = [x for x in g if x]
                p1 = mean([sum(r["resolved"] for r in x) / len(x) for x in g])
                pks = [pass_at_k(len(x), sum(r["resolved"] for r in x), k) for x in g if len(x) >= k]
                pk = mean(pks) if pks else None
                avg = mean([math.fsum(r["reward"] for r in x) / len(x) for x in g])
                graded_rows = [r for x in g for r in x]
                parsed = [r for r in graded_rows if r["answer_parsed"]]
                parse = len(parsed) / len(graded_rows) if graded_rows else None
                acc_parsed = sum(r["resolved"] for r in parsed) / len(parsed) if parsed else None
            out.append({"kind": "cell", "checkpoint": ck["name"], "train_harnesses": ck.get("train_harnesses", ""),
                        "harness_name": h, "held_out": h in held, "n_tasks": tasks_per_h.get(h, 0),
                        "planned": planned, "graded": graded, "infra_errors": infra, "timeouts": timeouts,
                        "graded_fraction": frac, "counted": counted, "k": k,
                        "pass_at_1": p1, "pass_at_k": pk, "avg_at_k": avg,
                        "parse_rate": parse, "acc_given_parsed": acc_parsed})
    cells = list(out)

    def agg(kind: str, ck: str, th: str, h: str, sel: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [c for c in sel if c["counted"]]

        def m(col: str) -> float | None:
            vals = [c[col] for c in ok if c[col] is not None]
            return mean(vals) if vals else None

        planned = sum(c["planned"] for c in sel)
        graded = sum(c["graded"] for c in sel)
        return {"kind": kind, "checkpoint": ck, "train_harnesses": th, "harness_name": h,
                "held_out": all(c["held_out"] for c in sel) and bool(sel), "n_tasks": sum(c["n_tasks"] for c in sel),
                "planned": planned, "graded": graded, "infra_errors": sum(c["infra_errors"] for c in sel),
                "timeouts": sum(c["timeouts"] for c in sel), "graded_fraction": graded / planned if planned else 0.0,
                "counted": bool(ok), "k": k, "pass_at_1": m("pass_at_1"), "pass_at_k": m("pass_at_k"),
                "avg_at_k": m("avg_at_k"), "parse_rate": m("parse_rate"), "acc_given_parsed": m("acc_given_parsed")}

    for ck in plan["checkpoints"]:
        out.append(agg("row_mean", ck["name"], ck.get("train_harnesses", ""), "*",
                       [c for c in cells if c["checkpoint"] == ck["name"]]))
    for h in plan["harnesses"]:
        out.append(agg("col_mean", "*", "", h, [c for c in cells if c["harness_name"] == h]))
    return out


def paired_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int, seed: int, level: float
                     ) -> tuple[float, float, float, float]:
    """Task-clustered paired bootstrap of ``mean(a - b)``.

    ``a[i]`` and ``b[i]`` are the two arms' scores on task i (float64 arrays of shape (n,)); each
    resample draws n task indices with replacement (numpy ``default_rng(seed)``) and keeps the
    pairing, so within-task correlation is respected (Efron & Tibshirani 1993, "An Introduction to
    the Bootstrap", ch. 13 percentile interval). Vectorised: one (resamples, n) index matrix.

    Returns:
        ``(estimate, ci_low, ci_high, p_value)``: the observed mean difference, the percentile
        interval at confidence ``level``, and the two-sided bootstrap p-value
        ``min(1, 2 * min(P*(d <= 0), P*(d >= 0)))``.

    Raises:
        ValueError: shapes differ, n == 0, ``resamples`` < 1 or ``level`` outside (0, 1).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired_bootstrap needs two equal-length non-empty 1-d arrays, got {a.shape} and {b.shape}")
    if resamples < 1 or not (0.0 < level < 1.0):
        raise ValueError(f"paired_bootstrap: resamples={resamples} must be >= 1 and level={level} in (0, 1)")
    d = a - b
    n = d.size
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n), dtype=np.int32)
    boot = d[idx].mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    p = min(1.0, 2.0 * min(float(np.mean(boot <= 0.0)), float(np.mean(boot >= 0.0))))
    return float(d.mean()), float(lo), float(hi), p


def seed_task_bootstrap(groups: list[np.ndarray], stat: Callable[[list[np.ndarray]], float], resamples: int,
                        seed: int, level: float) -> tuple[float, float, float, np.ndarray]:
    """Hierarchical bootstrap over training seeds and tasks of a statistic of several arms.

    ``groups[i]``: float64 ``[S_i, ..., T]``, arm i's per-task success rates under each of its
    S_i training seeds (the base checkpoint, untrained, is one row); the same T tasks, in the same
    order, in every group. The estimate is ``stat`` of the seed means ``[g.mean(axis=0) for g in
    groups]`` (each ``[..., T]``). Each of ``resamples`` resamples (numpy ``default_rng(seed)``)
    first draws, for each group in order, S_i of its seeds with replacement (nothing is drawn for a
    group of one), then T task indices with replacement, one draw shared by every group and seed:
    a test task is graded under every seed, so a task that is hard stays hard in every seed of the
    resample (drawing tasks anew per seed would treat the seeds' shared tasks as independent and
    understate the task variance). The seeds' spread enters through the seed draws: the interval
    widens with it. This is the two-way (crossed) bootstrap of Owen, "The pigeonhole bootstrap",
    Ann. Appl. Stat. 1 (2007), with the tasks paired across arms. With S seeds the seed variance
    is estimated from S values (the bootstrap's is (S - 1) / S of it): 3 seeds give a rough one.

    Returns:
        ``(estimate, ci_low, ci_high, boot)``: the percentile interval at confidence ``level``
        and the ``resamples`` bootstrap values (float64 ``[resamples]``).

    Raises:
        ValueError: no group, groups with different task counts or no task, ``resamples`` < 1 or
            ``level`` outside (0, 1).
    """
    if not groups or len({g.shape[-1] for g in groups}) != 1 or groups[0].shape[-1] == 0:
        raise ValueError(f"seed_task_bootstrap needs groups over the same non-empty tasks, got shapes "
                         f"{[g.shape for g in groups]}")
    if resamples < 1 or not (0.0 < level < 1.0):
        raise ValueError(f"seed_task_bootstrap: resamples={resamples} must be >= 1 and level={level} in (0, 1)")
    arrs = [np.asarray(g, dtype=np.float64) for g in groups]
    n = arrs[0].shape[-1]
    est = float(stat([g.mean(axis=0) for g in arrs]))
    rng = np.random.default_rng(seed)
    boot = np.empty(resamples, dtype=np.float64)
    for r in range(resamples):
        means = [g[rng.integers(0, len(g), len(g))].mean(axis=0) if len(g) > 1 else g[0] for g in arrs]
        t = rng.integers(0, n, n)
        boot[r] = stat([m[..., t] for m in means])
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    return est, float(lo), float(hi), boot


def pass_at_1_intervals(rows: list[dict[str, Any]], resamples: int, seed: int, level: float = 0.95
                        ) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    """Per (checkpoint, harness): ``(pass@1, ci_low, ci_high, n_tasks)`` over the sealed rows'
    final graded attempts, pass@1 being the mean over tasks of each task's solved share (as
    :func:`cell_table` computes it) and the interval the percentile bootstrap
    over tasks at confidence ``level`` (:func:`paired_bootstrap` against 0:
    tasks resampled, each keeping its attempts). Cells without a graded attempt are left out.

    Args:
        rows: sealed ``evaluations`` rows (``checkpoint``, ``harness_name``, ``task_id``,
            ``record_id``, ``attempt``, ``status``, ``resolved``, ``retry``).
        resamples: bootstrap resamples (>= 1); ``seed``: the resampling seed (the config's).

    Raises:
        ValueError: ``resamples`` < 1 or ``level`` outside (0, 1) (from paired_bootstrap).
    """
    out = {}
    for key, per_task in sorted(attempts_by_cell_and_task(final_attempts(rows)).items()):
        graded = [[r for r in rs if r["status"] in GRADED] for _, rs in sorted(per_task.items())]
        shares = np.array([sum(r["resolved"] for r in g) / len(g) for g in graded if g], dtype=np.float64)
        if shares.size:
            est, lo, hi, _ = paired_bootstrap(shares, np.zeros_like(shares), resamples, seed, level)
            out[key] = (est, lo, hi, int(shares.size))
    return out


def min_detectable_difference(sd_diff: float, n: int, alpha: float, m: int, power: float) -> float:
    """Minimum detectable difference of a paired two-sided test at Bonferroni level alpha/m:

        MDD = (z_{1 - alpha / (2 m)} + z_{power}) * sd_diff / sqrt(n)

    (paired normal approximation; e.g. Chow, Shao & Wang, "Sample Size Calculations in Clinical
    Research", 2nd ed., sec. 3.1, solved for the difference). ``sd_diff`` is the sample standard
    deviation of the per-task differences, ``n`` the number of tasks.

    Raises:
        ValueError: n < 1, m < 1, alpha or power outside (0, 1), or sd_diff < 0.
    """
    if n < 1 or m < 1 or not (0 < alpha < 1) or not (0 < power < 1) or sd_diff < 0:
        raise ValueError(f"min_detectable_difference: bad input sd_diff={sd_diff}, n={n}, alpha={alpha}, m={m}, "
                         f"power={power}")
    z = NormalDist()
    return (z.inv_cdf(1.0 - alpha / (2 * m)) + z.inv_cdf(power)) * sd_diff / math.sqrt(n)


def arm_members(plan: dict[str, Any], name: str) -> list[str]:
    """The checkpoints a contrast side or finding cell ``name`` stands for: the seed checkpoints of
    an arm trained under several seeds (``plan["arm_seeds"]``: arm -> ``[<arm>@s<seed>, ...]``),
    else ``[name]``."""
    return list((plan.get("arm_seeds") or {}).get(name, [name]))


def training_seeds(plan: dict[str, Any], name: str) -> int:
    """How many training runs ``name`` (a checkpoint or a seeded arm) stands for: 0 for an
    untrained checkpoint (``base``: no path in the plan), else its seed checkpoints' count."""
    paths = {c["name"]: c.get("path") for c in plan["checkpoints"]}
    members = arm_members(plan, name)
    return 0 if all(not paths.get(m) for m in members) else len(members)


def contrast_table(rows: list[dict[str, Any]], plan: dict[str, Any], cells: list[dict[str, Any]], *,
                   alpha: float, resamples: int, power: float) -> list[dict[str, Any]]:
    """Rows of the ``eval_contrasts`` artifact: each pre-registered contrast in ``plan["contrasts"]``
    (``{name, a: {checkpoint, harness}, b: {...}}``) as ``a - b`` of per-task success rates
    (resolved / graded final attempts) on the tasks both arms graded (of the contrast's ``suite``
    only, when it names one: ``plan["suite_of"]`` maps each test task to its suite).

    A side may name an arm trained under several seeds (:func:`arm_members`): its rate on a task
    is then the mean over its seed checkpoints, the tasks are those every seed checkpoint of both
    sides graded, and the interval is :func:`seed_task_bootstrap`'s (seeds, then tasks;
    ``interval`` = ``seed-task``; ``mdd`` None: the paired formula has no seed term). Otherwise the
    interval is :func:`paired_bootstrap`'s over tasks (``interval`` = ``task``), exactly as before
    seeds existed. ``a_seeds`` / ``b_seeds``: the training runs each side stands for
    (:func:`training_seeds`; 0 for ``base``).

    Bonferroni over the m contrasts: each CI is at level ``1 - alpha/m`` and each p-value is
    multiplied by m (capped at 1). The bootstrap seed of a contrast is
    ``seed_from(plan["seed"], "bootstrap", name)``. A contrast whose arm's cell is not counted
    (below the graded fraction; for a seeded arm, any of its seed checkpoints' cells) gets status
    ``cell_not_counted`` and null numbers; one with no task graded by both arms
    ``no_common_tasks``.
    """
    contrasts = plan["contrasts"]
    m = len(contrasts)
    held = set(plan.get("held_out", []))
    counted = {(c["checkpoint"], c["harness_name"]): c["counted"] for c in cells if c["kind"] == "cell"}
    counts = graded_counts(rows)

    def scores(ck: str, h: str) -> dict[str, float]:
        return {t: c / n for t, (n, c) in counts.get((ck, h), {}).items()}

    out = []
    for c in contrasts:
        a, b = c["a"], c["b"]
        seed = seed_from(plan["seed"], "bootstrap", c["name"])
        ma, mb = arm_members(plan, a["checkpoint"]), arm_members(plan, b["checkpoint"])
        seeded = len(ma) > 1 or len(mb) > 1
        row: dict[str, Any] = {"name": c["name"], "a_checkpoint": a["checkpoint"], "a_harness": a["harness"],
                               "b_checkpoint": b["checkpoint"], "b_harness": b["harness"],
                               "held_out": a["harness"] in held or b["harness"] in held, "status": "ok", "n_tasks": 0,
                               "a_mean": None, "b_mean": None, "estimate": None, "ci_low": None, "ci_high": None,
                               "p_value": None, "p_bonferroni": None, "alpha": alpha, "m_contrasts": m,
                               "sd_diff": None, "mdd": None, "power": power, "resamples": resamples, "seed": seed,
                               "a_seeds": training_seeds(plan, a["checkpoint"]),
                               "b_seeds": training_seeds(plan, b["checkpoint"]),
                               "interval": "seed-task" if seeded else "task"}
        if not (all(counted.get((x, a["harness"])) for x in ma) and all(counted.get((x, b["harness"])) for x in mb)):
            row["status"] = "cell_not_counted"
            out.append(row)
            continue
        sa = [scores(x, a["harness"]) for x in ma]
        sb = [scores(x, b["harness"]) for x in mb]
        common = sorted(set.intersection(*[set(x) for x in sa + sb]))
        if c.get("suite"):
            common = [t for t in common if plan["suite_of"].get(t) == c["suite"]]
        if not common:
            row["status"] = "no_common_tasks"
            out.append(row)
            continue
        ga = np.array([[x[t] for t in common] for x in sa], dtype=np.float64)  # [seeds of a, tasks]
        gb = np.array([[x[t] for t in common] for x in sb], dtype=np.float64)
        va, vb = ga.mean(axis=0), gb.mean(axis=0)
        level = 1.0 - alpha / m
        if seeded:
            est, lo, hi, boot = seed_task_bootstrap([ga, gb], lambda g: float((g[0] - g[1]).mean()), resamples, seed,
                                                    level)
            p = min(1.0, 2.0 * min(float(np.mean(boot <= 0.0)), float(np.mean(boot >= 0.0))))
        else:
            est, lo, hi, p = paired_bootstrap(va, vb, resamples, seed, level)
        sd = float(np.std(va - vb, ddof=1)) if len(common) > 1 else 0.0
        row.update(n_tasks=len(common), a_mean=float(va.mean()), b_mean=float(vb.mean()), estimate=est, ci_low=lo,
                   ci_high=hi, p_value=p, p_bonferroni=min(1.0, p * m), sd_diff=sd,
                   mdd=None if seeded else min_detectable_difference(sd, len(common), alpha, m, power))
        out.append(row)
    return out


#: fewest points (cells) a correlation or R^2 is reported on: two points always fit a line exactly,
#: three or four leave one or two degrees of freedom
MIN_POINTS = 5
#: rates move in steps of 1 / (tasks x attempts) (>= 1e-5 for any evaluation that runs); a side whose
#: values span no more than this is constant, not a measured difference
FLAT_TOL = 1e-6


def fit_na_reason(x: np.ndarray, y: np.ndarray, *, unit: str = "point", statistic: str = "an R^2",
                  min_points: int = MIN_POINTS) -> str:
    """Why a fit of ``y`` on ``x`` (float64 arrays ``[n]``, the defined points) is not reported,
    or "" when it is: it needs n >= ``min_points`` and both ranges (max - min) above
    :data:`FLAT_TOL`. The reason is one line naming the count (in ``unit``\ s) or the constant
    side. Used by the run report's R^2 table (:mod:`tasks.analysis.predictors`) and P1's
    correlation table (:mod:`tasks.evaluate.p1_correlations`)."""
    n = int(x.size)
    if n < min_points:
        return f"{n} {unit}(s): {statistic} needs >= {min_points} (two points always fit a line exactly)"
    if float(np.ptp(x)) <= FLAT_TOL:
        return f"predictor constant over the {n} {unit}s (range {float(np.ptp(x)):.2g})"
    if float(np.ptp(y)) <= FLAT_TOL:
        return f"target constant over the {n} {unit}s (range {float(np.ptp(y)):.2g})"
    return ""
