"""The statistics of ``benchmarks/learning.py``, kept apart so that tests can check them by hand:
which saved adapter holds at each wall-clock mark, the first time a learning curve crosses a
target (linear interpolation between snapshots), a ratio of mean times over seeds when some seeds
never reach the target (censored at the budget), and bootstrap intervals of held-out pass@1 over
seeds and tasks.

Times are wall-clock seconds from a side's process launch; accuracies are pass@1 in [0, 1].
Intervals are percentile bootstrap intervals (2.5th and 97.5th percentiles by default).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def snapshots_at_marks(iterations: Sequence[dict[str, Any]], budget_s: float, n: int) -> list[dict[str, Any]]:
    """The adapter that held at each of ``n`` even wall-clock marks ``budget_s * j / n`` (j = 1..n).

    Args:
        iterations: one dict per finished iteration, in order: ``iterations`` (the count finished,
            1, 2, ...), ``seconds`` (when it finished, from the launch) and ``adapter`` (where its
            weights were saved).
        budget_s: the training budget, seconds (> 0).
        n: how many marks (>= 1).

    Returns one dict per mark: ``mark_s`` (the mark), ``iterations`` (finished by the mark; 0: the
    base model), ``weights_s`` (when those weights were made; 0.0 for the base model) and
    ``adapter`` (None for the base model). The weights at a mark are those of the last iteration
    that finished at or before it: what a user stopping the run at that second would hold.

    Raises:
        ValueError: ``budget_s`` <= 0, ``n`` < 1, or the iterations' times go backwards.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s={budget_s!r} must be > 0")
    if n < 1:
        raise ValueError(f"n={n!r} marks: at least 1")
    times = [float(it["seconds"]) for it in iterations]
    if times != sorted(times):
        raise ValueError(f"iterations' seconds={times!r} go backwards")
    out = []
    for j in range(1, n + 1):
        mark = budget_s * j / n
        done = [it for it in iterations if float(it["seconds"]) <= mark]
        last = done[-1] if done else None
        out.append({"mark_s": round(mark, 3), "iterations": int(last["iterations"]) if last else 0,
                    "weights_s": round(float(last["seconds"]), 3) if last else 0.0,
                    "adapter": last["adapter"] if last else None})
    return out


def first_crossing(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first second at which ``curve`` reaches ``target``, interpolating linearly between its
    points.

    Args:
        curve: ``(seconds, pass@1)`` points in increasing time (the base model at 0 first).
        target: the pass@1 level.

    Returns the crossing time in seconds; the first point's time if it already reaches the target;
    None if no point reaches it (not reached within the curve: censored).

    Raises:
        ValueError: the curve is empty or its times are not increasing.
    """
    if not curve:
        raise ValueError("curve is empty: no point to cross the target")
    ts = [float(t) for t, _ in curve]
    if any(b <= a for a, b in zip(ts, ts[1:])):
        raise ValueError(f"curve times={ts!r} are not increasing")
    (t_prev, a_prev) = curve[0]
    if a_prev >= target:
        return float(t_prev)
    for t, a in curve[1:]:
        if a >= target:
            return float(t_prev + (target - a_prev) / (a - a_prev) * (t - t_prev))
        t_prev, a_prev = t, a
    return None


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.percentile(values, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def time_ratio(slow: Sequence[float | None], fast: Sequence[float | None], budget_s: float, *,
               resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """``mean(slow) / mean(fast)``: how many times sooner the ``fast`` side reaches the target,
    with a bootstrap interval over seeds (each side's seeds resampled with replacement, apart: the
    two sides' seeds are not paired).

    A seed that never reached the target (None) enters as ``budget_s``, which it would have
    exceeded: with censored seeds on the ``slow`` side only, the ratio and its interval are lower
    bounds (``bound: lower``); on the ``fast`` side only, upper bounds (``upper``); on both, neither
    holds and every figure is None with a ``reason``.

    Args:
        slow, fast: per-seed times to target, seconds, None where not reached.
        budget_s: the training budget, seconds.
        resamples: bootstrap resamples (0: no interval).
        seed: the bootstrap's random seed.
        level: the interval's coverage.

    Returns ``ratio``, ``ci_low``, ``ci_high``, ``bound`` (``exact``, ``lower``, ``upper`` or None),
    ``not_reached`` ({"slow": k, "fast": m}) and ``reason`` (why a figure is None, else None).
    The interval is None with a reason when either side has fewer than 2 seeds.

    Raises:
        ValueError: a side has no seeds, or a time is negative.
    """
    if not slow or not fast:
        raise ValueError(f"time_ratio: slow has {len(slow)} seed(s), fast {len(fast)}: both need at least 1")
    if any(t is not None and t < 0 for t in [*slow, *fast]):
        raise ValueError(f"time_ratio: negative time in slow={list(slow)!r} fast={list(fast)!r}")
    miss = {"slow": sum(t is None for t in slow), "fast": sum(t is None for t in fast)}
    out: dict[str, Any] = {"ratio": None, "ci_low": None, "ci_high": None, "bound": None, "not_reached": miss,
                           "reason": None}
    if miss["slow"] and miss["fast"]:
        out["reason"] = (f"both sides have seeds that never reached the target ({miss['slow']} slow, "
                         f"{miss['fast']} fast): the ratio is bounded neither way")
        return out
    s = np.array([budget_s if t is None else t for t in slow], dtype=float)
    f = np.array([budget_s if t is None else t for t in fast], dtype=float)
    if f.mean() == 0.0:
        out["reason"] = "the fast side's mean time to target is 0 s (its base model already reaches it): no ratio"
        return out
    out["ratio"] = float(s.mean() / f.mean())
    out["bound"] = "lower" if miss["slow"] else "upper" if miss["fast"] else "exact"
    if len(s) < 2 or len(f) < 2:
        out["reason"] = f"{len(s)} slow and {len(f)} fast seed(s): an interval over seeds needs at least 2 per side"
        return out
    if resamples <= 0:
        out["reason"] = "no bootstrap resamples asked for"
        return out
    rng = np.random.default_rng(seed)
    rs = s[rng.integers(0, len(s), (resamples, len(s)))].mean(axis=1)
    rf = f[rng.integers(0, len(f), (resamples, len(f)))].mean(axis=1)
    ok = rf > 0
    out["ci_low"], out["ci_high"] = _interval(rs[ok] / rf[ok], level)
    return out


def bootstrap_pass_at_1(groups: dict[str, Sequence[Sequence[float]]], pairs: Sequence[tuple[str, str]] = (), *,
                        resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict[str, dict[str, Any]]:
    """Mean held-out pass@1 of each group with a bootstrap interval over seeds and tasks, and the
    difference of each pair.

    Each resample draws, for every group apart, its seeds with replacement, then one draw of the
    tasks with replacement shared by all groups (the groups are evaluated on the same held-out
    tasks, so a difference is paired by task).

    Args:
        groups: name -> a seeds x tasks matrix of per-task pass@1 (the mean over attempts), the
            tasks in the same order in every group.
        pairs: ``(a, b)`` names whose difference ``a - b`` is reported as ``"a-b"``.
        resamples: bootstrap resamples (0: no interval).
        seed: the bootstrap's random seed.
        level: the interval's coverage.

    Returns name -> ``pass_at_1``, ``ci_low``, ``ci_high``, ``seeds``, ``reason`` (why the interval
    is None, or what it does not cover: with one seed it is over tasks only), and ``"a-b"`` ->
    ``diff``, ``ci_low``, ``ci_high``, ``reason``.

    Raises:
        ValueError: a group has no seeds or no tasks, the groups' task counts differ, or a pair names
            an unknown group.
    """
    mats = {}
    for name, m in groups.items():
        a = np.asarray(m, dtype=float)
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
            raise ValueError(f"group {name!r}: shape {a.shape} is not seeds x tasks with at least one of each")
        mats[name] = a
    n_tasks = {a.shape[1] for a in mats.values()}
    if len(n_tasks) > 1:
        raise ValueError(f"groups' task counts {sorted(n_tasks)} differ: the same held-out tasks are needed")
    for a_name, b_name in pairs:
        for x in (a_name, b_name):
            if x not in mats:
                raise ValueError(f"pair ({a_name!r}, {b_name!r}): no group {x!r}")
    (t,) = n_tasks or {0}
    rng = np.random.default_rng(seed)
    task_idx = rng.integers(0, t, (resamples, t)) if resamples > 0 else None
    draws: dict[str, np.ndarray] = {}
    out: dict[str, dict[str, Any]] = {}
    for name, a in mats.items():
        res: dict[str, Any] = {"pass_at_1": float(a.mean()), "ci_low": None, "ci_high": None, "seeds": a.shape[0],
                               "reason": None}
        if task_idx is not None:
            s_idx = rng.integers(0, a.shape[0], (resamples, a.shape[0]))
            draws[name] = a[s_idx[:, :, None], task_idx[:, None, :]].mean(axis=(1, 2))
            res["ci_low"], res["ci_high"] = _interval(draws[name], level)
            if a.shape[0] < 2:
                res["reason"] = "one seed: the interval is over tasks only"
        else:
            res["reason"] = "no bootstrap resamples asked for"
        out[name] = res
    for a_name, b_name in pairs:
        d: dict[str, Any] = {"diff": float(mats[a_name].mean() - mats[b_name].mean()), "ci_low": None, "ci_high": None,
                             "reason": None}
        if draws:
            d["ci_low"], d["ci_high"] = _interval(draws[a_name] - draws[b_name], level)
        else:
            d["reason"] = "no bootstrap resamples asked for"
        out[f"{a_name}-{b_name}"] = d
    return out
