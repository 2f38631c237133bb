import math

import numpy as np
import pytest

from tasks.analysis.ceiling import kl_soft_ceiling, mismatch_cells
from tasks.analysis.predictors import MIN_POINTS, NOT_MEASURED_STEP, na_reason, p1_points, r2_table

from ._rows import counts, ev

# k = 4, two tasks x four attempts. (resolved count of task A, of task B) per harness:
BASE = {"h1": (1, 0), "h2": (4, 0), "h3": (1, 1), "h4": (0, 0), "h5": (2, 0), "h6": (3, 2)}
STEP = {"h1": (2, 0), "h2": (4, 1), "h3": (2, 2), "h4": (0, 0), "h5": (3, 0), "h6": (4, 3)}
# by hand: pass@1 = (cA + cB) / 8; pass@4 of a task with n = 4 is 1 iff c >= 1
BASE_P1 = np.array([1, 4, 2, 0, 2, 5]) / 8
C = np.array([0.5, 0.5, 1.0, 0.0, 0.5, 1.0])
M = C - BASE_P1
STEP_P1 = np.array([2, 5, 4, 0, 3, 7]) / 8
GAIN = STEP_P1 - BASE_P1  # 1/8, 1/8, 1/4, 0, 1/8, 1/4 = C / 4 exactly
M_STEP = {"h1": 0.3, "h2": 0.1, "h3": 0.5, "h4": 0.0, "h5": 0.2, "h6": 0.4}


def _designed(harnesses=BASE):
    rows = []
    for ck, table in (("base", BASE), ("step1", STEP)):
        for h in harnesses:
            ca, cb = table[h]
            rows += counts(ck, h, "A", 4, ca) + counts(ck, h, "B", 4, cb)
    return rows


def _by(rows):
    return {(r["target"], r["predictor"]): r for r in rows}


def corr2(x, y):
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def test_r2_matches_numpy_on_the_designed_example():
    rows = _by(r2_table(_designed(), k=4, beta=1.0, resamples=200, seed=3, m_step=M_STEP))
    c_gain = rows[("gain", "C")]
    assert c_gain["r2"] == pytest.approx(1.0, abs=1e-12) and corr2(C, GAIN) == pytest.approx(1.0, abs=1e-12)
    assert c_gain["slope"] == pytest.approx(0.25, abs=1e-12) and c_gain["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert c_gain["n_points"] == 6 and c_gain["na_reason"] == ""
    m_gain = rows[("gain", "M")]
    assert m_gain["r2"] == pytest.approx(corr2(M, GAIN), abs=1e-12)
    assert m_gain["r2"] < 0.9
    assert rows[("return", "M")]["r2"] == pytest.approx(corr2(M, STEP_P1), abs=1e-12)
    assert rows[("return", "C")]["r2"] == pytest.approx(corr2(C, STEP_P1), abs=1e-12)
    # C - M is the reference's pass@1 under the simple estimator
    assert rows[("return", "C_minus_M")]["r2"] == pytest.approx(corr2(BASE_P1, STEP_P1), abs=1e-12)
    # M_step and C - M_step, with the per-step values given per harness
    ms = np.array([M_STEP[h] for h in BASE])
    assert rows[("gain", "M_step")]["r2"] == pytest.approx(corr2(ms, GAIN), abs=1e-12)
    assert rows[("return", "C_minus_M_step")]["r2"] == pytest.approx(corr2(C - ms, STEP_P1), abs=1e-12)
    assert not rows[("gain", "M_step")]["predictor_bootstrapped"] and rows[("gain", "C_minus_M_step")]["predictor_bootstrapped"]
    # the KL-soft ceiling per task then averaged over the reference's tasks
    soft = np.array([np.mean([kl_soft_ceiling(ca / 4, 1.0), kl_soft_ceiling(cb / 4, 1.0)]) for ca, cb in BASE.values()])
    assert rows[("gain", "C_kl_soft")]["r2"] == pytest.approx(corr2(soft, GAIN), abs=1e-12)
    assert [r["predictor"] for r in r2_table(_designed(), k=4, beta=None, resamples=10)][:5] == [
        "C", "M", "M_step", "C_minus_M", "C_minus_M_step"]


def test_p1_points_hold_the_predictors_of_the_base_and_the_targets():
    pts = p1_points(_designed(), k=4, beta=1.0, m_step=M_STEP)
    assert [(p["checkpoint"], p["harness_name"]) for p in pts] == [("step1", h) for h in BASE]
    for p, c, m, b, g, r in zip(pts, C, M, BASE_P1, GAIN, STEP_P1):
        ms = M_STEP[p["harness_name"]]
        assert (p["C"], p["M"], p["C_minus_M"], p["ref_pass_at_1"]) == pytest.approx((c, m, b, b), abs=1e-12)
        assert (p["M_step"], p["C_minus_M_step"]) == pytest.approx((ms, c - ms), abs=1e-12)
        assert (p["gain"], p["trained_return"]) == pytest.approx((g, r), abs=1e-12)
        ca, cb = BASE[p["harness_name"]]
        assert p["C_kl_soft"] == pytest.approx((kl_soft_ceiling(ca / 4, 1.0) + kl_soft_ceiling(cb / 4, 1.0)) / 2)
    bare = p1_points(_designed(), k=4, beta=None)
    assert all(p["M_step"] is None and p["C_minus_M_step"] is None and p["C_kl_soft"] is None for p in bare)


def test_cell_metrics_agree_with_mismatch_cells():
    # the R^2 table's points are built from the same cell metrics as the mismatch table
    cells = {(r["checkpoint"], r["harness_name"]): r for r in mismatch_cells(_designed(), k=4, beta=1.0)}
    assert [cells[("base", h)]["ceiling"] for h in BASE] == pytest.approx(C.tolist())
    assert [cells[("step1", h)]["pass_at_1"] for h in STEP] == pytest.approx(STEP_P1.tolist())
    pts = {p["harness_name"]: p for p in p1_points(_designed(), k=4, beta=1.0)}
    assert [cells[("base", h)]["ceiling_kl_soft"] for h in BASE] == pytest.approx([pts[h]["C_kl_soft"] for h in BASE])


def _random_evals(seed=0, tasks=30, attempts=4):
    rng = np.random.default_rng(seed)
    rows = []
    base_rate = {"h1": 0.05, "h2": 0.2, "h3": 0.4, "h4": 0.6}
    for t in range(tasks):
        difficulty = rng.uniform(0.2, 1.5)
        for h, p in base_rate.items():
            for ck, lift in (("base", 0.0), ("s1", 0.15), ("s2", 0.3)):
                q = min(1.0, (p + lift * p) * difficulty)
                rows += [ev(ck, h, f"t{t}", a, "resolved" if rng.random() < q else "unresolved")
                         for a in range(attempts)]
    return rows


def test_bootstrap_interval_contains_the_estimate_and_is_reproducible():
    evals = _random_evals()
    a = r2_table(evals, k=4, beta=0.5, resamples=400, seed=11)
    assert a == r2_table(evals, k=4, beta=0.5, resamples=400, seed=11)
    other = r2_table(evals, k=4, beta=0.5, resamples=400, seed=12)
    assert [r["ci_low"] for r in a] != [r["ci_low"] for r in other]
    inside = 0
    assert {r["predictor"] for r in a if r["na_reason"]} == {"M_step", "C_minus_M_step"}  # no branching given
    for r in (r for r in a if not r["na_reason"]):
        assert r["n_points"] == 8 and r["resamples_valid"] == 400 and r["predictor_bootstrapped"]
        assert 0.0 <= r["ci_low"] <= r["ci_high"] <= 1.0, r
        if r["r2"] < 0.98:  # see r2_table's docstring: near 1 the percentile interval can lie below it
            assert r["ci_low"] <= r["r2"] <= r["ci_high"], r
            inside += 1
    assert inside >= 6
    by = _by(a)
    assert by[("return", "C")]["r2"] > 0.5  # base ceiling orders the harnesses' returns


def test_degenerate_statistics_are_na_with_the_reason_never_a_number():
    # fewer than 5 points: two harnesses give 2 points, and two points always fit exactly
    two = _by(r2_table(_designed(["h1", "h3"]), k=4, beta=1.0, resamples=50, m_step=M_STEP))
    assert set(r["n_points"] for r in two.values()) == {2}
    for r in two.values():
        assert r["r2"] is None and r["slope"] is None and r["intercept"] is None and r["ci_low"] is None
        assert r["na_reason"].startswith("2 point(s)") and f">= {MIN_POINTS}" in r["na_reason"]
    four = _by(r2_table(_designed(["h1", "h2", "h3", "h5"]), k=4, beta=None, resamples=50))
    assert four[("gain", "C")]["r2"] is None and four[("gain", "C")]["na_reason"].startswith("4 point(s)")
    # without branching M_step is not measured: said so, not left blank
    none = _by(r2_table(_designed(), k=4, beta=None, resamples=50))
    for key in (("gain", "M_step"), ("return", "C_minus_M_step")):
        assert none[key]["r2"] is None and none[key]["n_points"] == 0 and none[key]["na_reason"] == NOT_MEASURED_STEP
    # a constant predictor: M_step equal under every harness
    flat = _by(r2_table(_designed(), k=4, beta=None, resamples=50, m_step={h: 0.3 for h in BASE}))
    assert flat[("gain", "M_step")]["r2"] is None and "predictor constant" in flat[("gain", "M_step")]["na_reason"]
    # a predictor whose values differ by 2e-8 (the old soft ceiling at beta 0.05) is constant, not a slope of 1e7
    tiny = _by(r2_table(_designed(), k=4, beta=None, resamples=50,
                        m_step={h: 0.3 + 2e-8 * i for i, h in enumerate(BASE)}))
    assert tiny[("gain", "M_step")]["r2"] is None and "predictor constant" in tiny[("gain", "M_step")]["na_reason"]
    # a constant target: the trained checkpoint equals the base everywhere -> gain 0 at every point
    same = [dict(r, checkpoint="step1") for r in _designed() if r["checkpoint"] == "base"]
    rows = [r for r in _designed() if r["checkpoint"] == "base"] + same
    const = _by(r2_table(rows, k=4, beta=None, resamples=50))
    assert const[("gain", "C")]["r2"] is None and "target constant" in const[("gain", "C")]["na_reason"]
    assert const[("return", "C")]["na_reason"] == ""  # the return still varies: defined


def test_na_reason_rules():
    x = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    assert na_reason(x, x) == ""
    assert na_reason(x[:4], x[:4]).startswith("4 point(s)")
    assert "predictor constant" in na_reason(np.full(5, 0.2), x)
    assert "target constant" in na_reason(x, np.full(5, 0.2))


def test_r2_table_rejects_bad_input():
    with pytest.raises(ValueError, match="nan"):
        r2_table(_designed(), k=4, beta=None, m_step={"h1": math.nan})
    with pytest.raises(ValueError, match="level"):
        r2_table(_designed(), k=4, beta=None, level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        r2_table(_designed(), k=4, beta=None, resamples=0)


def test_rank_correlations_order_the_points_and_say_na_when_undefined():
    from tasks.analysis.predictors import rank_correlations

    # C orders the gains exactly but not linearly (rho 1, R^2 < 1); M reverses them; a tie in
    # C - M takes average ranks; M_step was not measured
    gains = [0.01, 0.02, 0.10, 0.40, 0.41]
    pts = [{"C": c, "C_kl_soft": 0.3, "M": -c, "M_step": None, "C_minus_M": cm, "C_minus_M_step": None,
            "gain": g, "trained_return": 0.2 + g} for c, cm, g in zip([0.1, 0.2, 0.3, 0.9, 5.0], [1, 2, 2, 4, 5], gains)]
    rows = {(r["target"], r["predictor"]): r for r in rank_correlations(pts)}
    assert rows[("gain", "C")]["rho"] == pytest.approx(1.0) and rows[("return", "C")]["rho"] == pytest.approx(1.0)
    assert rows[("gain", "M")]["rho"] == pytest.approx(-1.0)
    # ranks of C - M: 1, 2.5, 2.5, 4, 5 against 1..5: Pearson of the ranks
    r = np.array([1, 2.5, 2.5, 4, 5])
    assert rows[("gain", "C_minus_M")]["rho"] == pytest.approx(np.corrcoef(r, np.arange(1, 6))[0, 1])
    assert rows[("gain", "C_kl_soft")]["rho"] is None and "predictor constant" in rows[("gain", "C_kl_soft")]["na_reason"]
    assert rows[("gain", "M_step")]["rho"] is None and "not measured" in rows[("gain", "M_step")]["na_reason"]
    few = {(r["target"], r["predictor"]): r for r in rank_correlations(pts[:4])}
    assert few[("gain", "C")]["rho"] is None and "4 point(s)" in few[("gain", "C")]["na_reason"]
