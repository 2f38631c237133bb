import math

import numpy as np
import pytest

from tasks.analysis.ceiling import kl_soft_ceiling, kl_soft_ceiling_array, kl_soft_ceiling_tasks, mismatch_cells

from ._rows import ev, outcomes

E = math.e


def test_kl_soft_ceiling_hand_value():
    assert kl_soft_ceiling(0.25, 1.0) == pytest.approx(0.25 * E / (0.75 + 0.25 * E), abs=1e-12)
    # beta = 0.5: e^{1/beta} = e^2
    assert kl_soft_ceiling(0.1, 0.5) == pytest.approx(0.1 * E**2 / (0.9 + 0.1 * E**2), abs=1e-12)


def test_kl_soft_ceiling_is_per_task_then_averaged():
    # P1 by hand (docs/methods/p1-ceiling-mismatch.md): half the tasks at p = 0 (never solved:
    # cannot be lifted), half at 0.6
    j = 0.6 * math.exp(20) / (0.4 + 0.6 * math.exp(20))  # J(0.6) at beta 0.05
    assert kl_soft_ceiling_tasks([0.0, 0.6], 0.05) == pytest.approx(0.5 * j, abs=1e-15)
    assert kl_soft_ceiling_tasks([0.0, 0.6, 0.0, 0.6], 0.05) == pytest.approx(0.5 * j, abs=1e-15)
    assert kl_soft_ceiling_tasks([0.0, 0.6], 0.05) < 0.5  # the aggregated J(0.3) would be 0.999999995
    assert kl_soft_ceiling(0.3, 0.05) > 0.99999999
    # beta 1: J(0.6) = 0.6 e / (0.4 + 0.6 e)
    assert kl_soft_ceiling_tasks([0.0, 0.6], 1.0) == pytest.approx(0.5 * 0.6 * E / (0.4 + 0.6 * E), abs=1e-15)
    assert kl_soft_ceiling_tasks([], 1.0) is None
    with pytest.raises(ValueError, match="1.5"):
        kl_soft_ceiling_tasks([0.2, 1.5], 1.0)


def test_mismatch_cells_soft_ceiling_half_unsolved_tasks():
    # the reference never solves task A, solves B 3 times in 5 (p = 0.6): C_soft = 0.5 J(0.6)
    rows = outcomes("base", "h", "A", ["unresolved"] * 5) + outcomes("base", "h", "B", ["resolved"] * 3 + ["unresolved"] * 2)
    (cell,) = mismatch_cells(rows, k=1, beta=0.05)
    assert cell["ref_pass_at_1"] == pytest.approx(0.3)
    assert cell["ceiling_kl_soft"] == pytest.approx(0.5 * kl_soft_ceiling(0.6, 0.05), abs=1e-15)
    assert cell["mismatch_kl_soft"] == pytest.approx(0.5 * kl_soft_ceiling(0.6, 0.05) - 0.3, abs=1e-15)


def test_kl_soft_ceiling_limits():
    assert kl_soft_ceiling(0.0, 1.0) == 0.0
    assert kl_soft_ceiling(1.0, 1.0) == 1.0
    assert kl_soft_ceiling(0.3, 0.0) == 1.0  # beta -> 0+: the best action with any mass wins
    assert kl_soft_ceiling(0.0, 0.0) == 0.0
    assert kl_soft_ceiling(0.3, math.inf) == pytest.approx(0.3, abs=1e-15)  # no reward pull: the reference
    assert kl_soft_ceiling(0.3, 1e6) == pytest.approx(0.3 + 0.3 * 0.7 * 1e-6, rel=1e-9)  # d J / d(1/beta) = p(1-p)
    assert kl_soft_ceiling(0.3, 1e-300) == 1.0  # 1/beta overflows to inf: no error
    # tiny p and small beta: the naive formula with p e^{100} still fits in a float here
    p = 1e-300
    assert kl_soft_ceiling(p, 0.01) == pytest.approx(p * math.exp(100) / (1 - p + p * math.exp(100)), rel=1e-9)
    assert 0.0 < kl_soft_ceiling(1e-300, 1.0) < 1e-299


@pytest.mark.parametrize("p,beta,needle", [(-0.1, 1.0, "-0.1"), (1.5, 1.0, "1.5"), (math.nan, 1.0, "nan"),
                                           (0.5, -1.0, "-1.0"), (0.5, math.nan, "nan"), (True, 1.0, "True")])
def test_kl_soft_ceiling_rejects_bad_input_naming_the_value(p, beta, needle):
    with pytest.raises(ValueError, match=needle):
        kl_soft_ceiling(p, beta)


@pytest.mark.parametrize("beta", [0.0, 0.05, 1.0, 7.0, math.inf])
def test_kl_soft_ceiling_array_equals_the_scalar(beta):
    ps = np.array([0.0, 1e-12, 0.01, 0.25, 0.5, 0.9, 1 - 1e-12, 1.0, np.nan])
    got = kl_soft_ceiling_array(ps, beta)
    assert np.isnan(got[-1])
    assert got[:-1] == pytest.approx([kl_soft_ceiling(float(p), beta) for p in ps[:-1]], abs=1e-15)
    with pytest.raises(ValueError, match="1.2"):
        kl_soft_ceiling_array(np.array([0.5, 1.2]), beta)


def _evals():
    rows = []
    # base / h1, task A: R, U, infra_error retried -> R, timeout  => 4 graded, 2 resolved
    rows += [ev("base", "h1", "A", 0, "resolved"), ev("base", "h1", "A", 1, "unresolved"),
             ev("base", "h1", "A", 2, "infra_error"), ev("base", "h1", "A", 2, "resolved", retry=1),
             ev("base", "h1", "A", 3, "timeout")]
    # base / h1, task B: U, U, U, infra_error (not retried) => 3 graded, 0 resolved, 1 infra error
    rows += outcomes("base", "h1", "B", ["unresolved", "unresolved", "unresolved", "infra_error"])
    # step1 / h1: A all resolved; B one of four
    rows += outcomes("step1", "h1", "A", ["resolved"] * 4)
    rows += outcomes("step1", "h1", "B", ["resolved", "unresolved", "unresolved", "unresolved"])
    # step1 / h2: no base cell under h2
    rows += outcomes("step1", "h2", "A", ["resolved", "unresolved", "unresolved", "unresolved"])
    return rows


def test_mismatch_cells_hand_computed():
    # per task, then averaged: base/h1 rates A = 2/4, B = 0/3 -> (J(0.5) + J(0)) / 2 = e / (1 + e) / 2
    soft = 0.5 * (0.5 * E / (0.5 + 0.5 * E) + 0.0)
    rows = {(r["checkpoint"], r["harness_name"]): r for r in mismatch_cells(_evals(), k=2, beta=1.0)}
    assert list(rows) == [("base", "h1"), ("step1", "h1"), ("step1", "h2")]
    b = rows[("base", "h1")]
    # the retried infra error counts once, by its final outcome (resolved)
    assert (b["n_tasks"], b["attempts"], b["graded"], b["infra_errors"]) == (2, 8, 7, 1)
    assert b["pass_at_1"] == pytest.approx((2 / 4 + 0 / 3) / 2, abs=1e-12)
    # pass@2: A (n=4, c=2) = 1 - C(2,2)/C(4,2) = 5/6; B (n=3, c=0) = 0
    assert b["ceiling"] == pytest.approx((5 / 6 + 0) / 2, abs=1e-12)
    assert b["ceiling_tasks"] == 2
    assert b["mismatch"] == pytest.approx(5 / 12 - 1 / 4, abs=1e-12)
    assert b["ref_pass_at_1"] == pytest.approx(0.25)
    assert b["ceiling_kl_soft"] == pytest.approx(soft, abs=1e-12)
    assert b["mismatch_kl_soft"] == pytest.approx(soft - 0.25, abs=1e-12)
    s = rows[("step1", "h1")]
    assert s["pass_at_1"] == pytest.approx((1 + 0.25) / 2)
    # pass@2: A = 1; B (n=4, c=1) = 1 - C(3,2)/C(4,2) = 1/2
    assert s["ceiling"] == pytest.approx(0.75)
    assert s["ref_pass_at_1"] == pytest.approx(0.25)
    # the trained checkpoint beats the KL-soft ceiling of the base: reported negative, not clamped
    assert s["mismatch_kl_soft"] == pytest.approx(soft - 0.625, abs=1e-12) and s["mismatch_kl_soft"] < 0
    h2 = rows[("step1", "h2")]
    assert h2["ref_pass_at_1"] is None and h2["ceiling_kl_soft"] is None and h2["mismatch_kl_soft"] is None
    assert h2["ceiling"] == pytest.approx(1 - 3 / 6)


def test_mismatch_cells_tasks_with_fewer_than_k_attempts_leave_the_ceiling():
    rows = {(r["checkpoint"], r["harness_name"]): r for r in mismatch_cells(_evals(), k=4, beta=None)}
    b = rows[("base", "h1")]
    # only task A has 4 graded attempts; pass@4 of (n=4, c=2) = 1
    assert b["ceiling_tasks"] == 1 and b["ceiling"] == pytest.approx(1.0)
    assert b["mismatch"] == pytest.approx(0.75)
    assert b["kl_beta"] is None and b["ceiling_kl_soft"] is None and b["mismatch_kl_soft"] is None
    rows5 = mismatch_cells(_evals(), k=5, beta=None)
    assert all(r["ceiling"] is None and r["mismatch"] is None and r["ceiling_tasks"] == 0 for r in rows5)


def test_mismatch_cells_with_nothing_graded():
    rows = mismatch_cells(outcomes("base", "h1", "A", ["infra_error", "infra_error"]), k=1, beta=0.5)
    assert rows[0]["pass_at_1"] is None and rows[0]["ceiling"] is None and rows[0]["ceiling_kl_soft"] is None
    assert rows[0]["infra_errors"] == 2 and rows[0]["graded"] == 0


def test_mismatch_cells_rejects_bad_input():
    with pytest.raises(ValueError, match="k"):
        mismatch_cells(_evals(), k=0, beta=None)
    with pytest.raises(ValueError, match="-2"):
        mismatch_cells(_evals(), k=2, beta=-2.0)
    bad = _evals()
    del bad[3]["record_id"]
    with pytest.raises(ValueError, match="row 3 .*record_id"):
        mismatch_cells(bad, k=2, beta=None)
    bad = _evals()
    bad[0]["status"] = "ok"
    with pytest.raises(ValueError, match="'ok'"):
        mismatch_cells(bad, k=2, beta=None)


