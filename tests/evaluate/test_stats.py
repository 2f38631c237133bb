from itertools import combinations

import pytest

from tasks.evaluate.stats import pass_at_k


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 6), (10, 1, 4), (4, 4, 2)])
def test_pass_at_k_equals_fraction_of_k_subsets_with_a_pass(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_1_is_the_mean():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


import numpy as np  # noqa: E402

from tasks.evaluate.stats import min_detectable_difference, paired_bootstrap  # noqa: E402


def test_paired_bootstrap_is_seeded_paired_and_matches_a_loop():
    rng = np.random.default_rng(0)
    b = rng.random(40)
    a = b + 0.1 + rng.normal(0, 0.01, 40)  # a beats b by ~0.1 on every task: pairing makes the CI tight
    est, lo, hi, p = paired_bootstrap(a, b, 2000, seed=7, level=0.95)
    assert est == pytest.approx(float(np.mean(a - b)))
    assert 0.09 < lo < est < hi < 0.11 and p == 0.0
    assert paired_bootstrap(a, b, 2000, seed=7, level=0.95) == (est, lo, hi, p)
    # the same resamples by an explicit loop
    idx = np.random.default_rng(7).integers(0, 40, size=(2000, 40), dtype=np.int32)
    boot = np.array([np.mean((a - b)[i]) for i in idx])
    assert lo == pytest.approx(np.quantile(boot, 0.025)) and hi == pytest.approx(np.quantile(boot, 0.975))


def test_paired_bootstrap_of_no_difference_has_p_one():
    x = np.array([0.0, 1.0, 0.5, 0.5])
    assert paired_bootstrap(x, x, 500, seed=1, level=0.9) == (0.0, 0.0, 0.0, 1.0)


def test_mdd_formula():
    # (z_{1-0.05/(2*4)} + z_{0.8}) * 0.5 / sqrt(100) = (2.4977 + 0.8416) * 0.05
    assert min_detectable_difference(0.5, 100, 0.05, 4, 0.8) == pytest.approx((2.497705 + 0.841621) * 0.05, abs=1e-5)
    with pytest.raises(ValueError, match="n=0"):
        min_detectable_difference(0.5, 0, 0.05, 1, 0.8)


# ---- contrast_table: the Bonferroni level and the sign of a - b -------------------------------

from tasks.evaluate.stats import cell_table, contrast_table  # noqa: E402
from tasks.hashing import seed_from  # noqa: E402


def _contrast_rows(rates: dict[tuple[str, str], list[int]], attempts: int = 2) -> list[dict]:
    """Sealed-style rows: ``rates[(checkpoint, harness)][i]`` = resolved attempts of task i."""
    rows = []
    for (ck, h), per_task in rates.items():
        for i, c in enumerate(per_task):
            for a in range(attempts):
                ok = a < c
                rows.append({"checkpoint": ck, "harness_name": h, "record_id": f"t{i}|{h}", "task_id": f"t{i}",
                             "attempt": a, "retry": 0, "status": "resolved" if ok else "unresolved",
                             "resolved": ok, "reward": float(ok), "answer_parsed": True})
    return rows


def _plan(n_tasks: int, harnesses: list[str], contrasts: list[dict], attempts: int = 2) -> dict:
    return {"records": [{"record_id": f"t{i}|{h}", "task_id": f"t{i}", "harness_name": h}
                        for h in harnesses for i in range(n_tasks)],
            "checkpoints": [{"name": "base"}, {"name": "final"}], "harnesses": harnesses, "held_out": [],
            "attempts": attempts, "seed": 99, "contrasts": contrasts}


def test_contrast_estimate_is_a_minus_b_by_hand():
    # per-task success rates (2 attempts): final = [1, 1, 0.5, 1], base = [0, 0.5, 0.5, 0]
    # -> a - b = [1, 0.5, 0, 1], mean +0.625; every difference >= 0, so the interval is >= 0 too
    rows = _contrast_rows({("final", "h"): [2, 2, 1, 2], ("base", "h"): [0, 1, 1, 0]})
    plan = _plan(4, ["h"], [{"name": "final-vs-base", "a": {"checkpoint": "final", "harness": "h"},
                             "b": {"checkpoint": "base", "harness": "h"}}])
    (c,) = contrast_table(rows, plan, cell_table(rows, plan, 0.95), alpha=0.05, resamples=500, power=0.8)
    assert c["status"] == "ok" and c["n_tasks"] == 4
    assert c["a_mean"] == pytest.approx(0.875) and c["b_mean"] == pytest.approx(0.25)
    assert c["estimate"] == pytest.approx(+0.625, abs=1e-12)
    assert 0.0 <= c["ci_low"] <= c["estimate"] <= c["ci_high"] <= 1.0
    assert c["sd_diff"] == pytest.approx(float(np.std([1, 0.5, 0, 1], ddof=1)))


def test_contrast_intervals_are_at_the_bonferroni_level_one_minus_alpha_over_m():
    rng = np.random.default_rng(5)
    n, hs = 60, ["h1", "h2", "h3", "h4"]
    rates = {}
    for h in hs:
        rates[("base", h)] = rng.integers(0, 3, n).tolist()
        rates[("final", h)] = rng.integers(0, 3, n).tolist()
    rows = _contrast_rows(rates)
    contrasts = [{"name": f"final-vs-base:{h}", "a": {"checkpoint": "final", "harness": h},
                  "b": {"checkpoint": "base", "harness": h}} for h in hs]
    plan = _plan(n, hs, contrasts)
    alpha, m, resamples = 0.1, 4, 4000
    out = contrast_table(rows, plan, cell_table(rows, plan, 0.95), alpha=alpha, resamples=resamples, power=0.8)
    for c in out:
        h = c["a_harness"]
        order = sorted(range(n), key=lambda i: f"t{i}")  # the table pairs tasks in task-id order
        d = (np.array(rates[("final", h)]) - np.array(rates[("base", h)]))[order] / 2.0
        seed = seed_from(99, "bootstrap", c["name"])
        idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n), dtype=np.int32)
        boot = d[idx].mean(axis=1)
        # the family-wise level: each interval at 1 - alpha/m, quantiles alpha/(2m) and 1 - alpha/(2m)
        assert c["m_contrasts"] == m
        assert c["ci_low"] == pytest.approx(np.quantile(boot, alpha / (2 * m)), abs=1e-12)
        assert c["ci_high"] == pytest.approx(np.quantile(boot, 1 - alpha / (2 * m)), abs=1e-12)
        # ... strictly wider than the unadjusted 1 - alpha interval on these data
        assert c["ci_low"] < np.quantile(boot, alpha / 2) and c["ci_high"] > np.quantile(boot, 1 - alpha / 2)
        assert c["p_bonferroni"] == pytest.approx(min(1.0, m * c["p_value"]))


def test_parse_rate_and_accuracy_given_parsed_per_cell_by_hand():
    # 4 tasks x 2 attempts under h: resolved [2, 1, 0, 1]; parsed: attempt 0 of every task, and
    # attempt 1 of task 0 -> 5 of 8 parsed; resolved among parsed: t0 a0, t0 a1, t1 a0, t3 a0 = 4 of 5
    rows = _contrast_rows({("final", "h"): [2, 1, 0, 1], ("base", "h"): [0, 0, 0, 0]})
    for r in rows:
        r["answer_parsed"] = r["attempt"] == 0 or (r["task_id"] == "t0" and r["checkpoint"] == "final")
        if r["checkpoint"] == "base":
            r["answer_parsed"] = False
    plan = _plan(4, ["h"], [])
    cells = {(c["kind"], c["checkpoint"]): c for c in cell_table(rows, plan, 0.95)}
    final, base = cells[("cell", "final")], cells[("cell", "base")]
    assert final["pass_at_1"] == pytest.approx(0.5)
    assert final["parse_rate"] == pytest.approx(5 / 8) and final["acc_given_parsed"] == pytest.approx(4 / 5)
    assert base["parse_rate"] == 0.0 and base["acc_given_parsed"] is None  # none parsed: undefined, not 0
    assert cells[("col_mean", "*")]["parse_rate"] == pytest.approx((5 / 8 + 0.0) / 2)
