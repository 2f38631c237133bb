import numpy as np
import pytest

from tasks.analysis.ceiling import kl_soft_ceiling, mismatch_cells
from tasks.analysis.predictors import r2_table

from ._rows import counts, ev

# k = 4, two tasks x four attempts. (resolved count of task A, of task B) per harness:
BASE = {"h1": (1, 0), "h2": (4, 0), "h3": (1, 1), "h4": (0, 0)}
STEP = {"h1": (2, 0), "h2": (4, 1), "h3": (2, 2), "h4": (0, 0)}
# by hand: pass@1 = (cA + cB) / 8; pass@4 of a task with n = 4 is 1 iff c >= 1
BASE_P1 = np.array([1 / 8, 4 / 8, 2 / 8, 0.0])
C = np.array([0.5, 0.5, 1.0, 0.0])
M = C - BASE_P1  # 3/8, 0, 3/4, 0
STEP_P1 = np.array([2 / 8, 5 / 8, 4 / 8, 0.0])
GAIN = STEP_P1 - BASE_P1  # 1/8, 1/8, 1/4, 0 = C / 4 exactly


def _designed():
    rows = []
    for ck, table in (("base", BASE), ("step1", STEP)):
        for h, (ca, cb) in table.items():
            rows += counts(ck, h, "A", 4, ca) + counts(ck, h, "B", 4, cb)
    return rows


def _by(rows):
    return {(r["target"], r["predictor"]): r for r in rows}


def corr2(x, y):
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def test_r2_matches_numpy_on_the_designed_example():
    rows = _by(r2_table(_designed(), k=4, beta=1.0, resamples=200, seed=3))
    c_gain = rows[("gain", "C")]
    assert c_gain["r2"] == pytest.approx(1.0, abs=1e-12) and corr2(C, GAIN) == pytest.approx(1.0, abs=1e-12)
    assert c_gain["slope"] == pytest.approx(0.25, abs=1e-12) and c_gain["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert c_gain["n_points"] == 4 and not c_gain["degenerate"]
    m_gain = rows[("gain", "M")]
    assert m_gain["r2"] == pytest.approx(corr2(M, GAIN), abs=1e-12)
    assert m_gain["r2"] < 0.9
    assert rows[("return", "M")]["r2"] == pytest.approx(corr2(M, STEP_P1), abs=1e-12)
    assert rows[("return", "C")]["r2"] == pytest.approx(corr2(C, STEP_P1), abs=1e-12)
    # C - M is the reference's pass@1 under the simple estimator
    assert rows[("return", "C_minus_M")]["r2"] == pytest.approx(corr2(BASE_P1, STEP_P1), abs=1e-12)
    soft = np.array([kl_soft_ceiling(float(p), 1.0) for p in BASE_P1])
    assert rows[("gain", "C_kl_soft")]["r2"] == pytest.approx(corr2(soft, GAIN), abs=1e-12)
    assert [r["predictor"] for r in r2_table(_designed(), k=4, beta=None, resamples=10)][:3] == ["C", "M", "C_minus_M"]


def test_cell_metrics_agree_with_mismatch_cells():
    # the R^2 table's points are built from the same cell metrics as the mismatch table
    cells = {(r["checkpoint"], r["harness_name"]): r for r in mismatch_cells(_designed(), k=4, beta=None)}
    assert [cells[("base", h)]["ceiling"] for h in BASE] == pytest.approx(C.tolist())
    assert [cells[("step1", h)]["pass_at_1"] for h in STEP] == pytest.approx(STEP_P1.tolist())


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
    for r in a:
        assert r["n_points"] == 8 and r["resamples_valid"] == 400 and r["predictor_bootstrapped"]
        assert 0.0 <= r["ci_low"] <= r["ci_high"] <= 1.0, r
        if r["r2"] < 0.98:  # see r2_table's docstring: near 1 the percentile interval can lie below it
            assert r["ci_low"] <= r["r2"] <= r["ci_high"], r
            inside += 1
    assert inside >= 6
    by = _by(a)
    assert by[("return", "C")]["r2"] > 0.5  # base ceiling orders the harnesses' returns


def test_degenerate_and_fixed_extra_predictors():
    extra = {
        "flat": {("base", h): 0.3 for h in BASE},
        # (checkpoint, h) overrides (reference, h); h4 has neither -> left out
        "per_step": {("base", "h1"): 9.0, ("step1", "h1"): 1 / 8, ("base", "h2"): 1 / 8, ("base", "h3"): 1 / 4},
    }
    rows = _by(r2_table(_designed(), k=4, beta=None, resamples=100, seed=0, extra_predictors=extra))
    flat = rows[("gain", "flat")]
    assert flat["r2"] == 0.0 and flat["degenerate"] and flat["slope"] == 0.0
    assert flat["intercept"] == pytest.approx(GAIN.mean())
    assert flat["ci_low"] == 0.0 and flat["ci_high"] == 0.0 and not flat["predictor_bootstrapped"]
    ps = rows[("gain", "per_step")]
    assert ps["n_points"] == 3 and ps["r2"] == pytest.approx(1.0, abs=1e-12) and ps["slope"] == pytest.approx(1.0)
    # a target with zero variance is degenerate too: one harness only -> a single point
    one = [r for r in _designed() if r["harness_name"] == "h1"]
    single = _by(r2_table(one, k=4, beta=None, resamples=10))[("gain", "C")]
    assert single["n_points"] == 1 and single["degenerate"] and single["r2"] == 0.0
    none = _by(r2_table([r for r in one if r["checkpoint"] == "base"], k=4, beta=None, resamples=10))[("gain", "C")]
    assert none["n_points"] == 0 and none["r2"] is None and none["ci_low"] is None


def test_r2_table_rejects_bad_input():
    with pytest.raises(ValueError, match="clashes"):
        r2_table(_designed(), k=4, beta=None, extra_predictors={"M": {}})
    with pytest.raises(ValueError, match="nan"):
        r2_table(_designed(), k=4, beta=None, extra_predictors={"x": {("base", "h1"): float("nan")}})
    with pytest.raises(ValueError, match="level"):
        r2_table(_designed(), k=4, beta=None, level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        r2_table(_designed(), k=4, beta=None, resamples=0)
