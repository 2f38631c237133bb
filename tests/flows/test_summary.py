"""The end-of-run summary: pass@1 intervals over tasks, and the sentence that reads the contrasts."""

import numpy as np
import pytest

from flows.summary import reading
from tasks.evaluate.stats import pass_at_1_intervals


def _row(ck, h, task, attempt, resolved, status="resolved", retry=0):
    return {"checkpoint": ck, "harness_name": h, "task_id": task, "attempt": attempt, "retry": retry,
            "status": status if status != "resolved" else ("resolved" if resolved else "unresolved"),
            "resolved": resolved, "record_id": f"r-{h}-{task}", "eval_id": f"{ck}{h}{task}{attempt}{retry}", "retry_of": "", "seq": 0}


def test_intervals_are_over_tasks_of_solved_shares_and_skip_infra_errors():
    rows = [_row("base", "direct", "t1", 0, True), _row("base", "direct", "t1", 1, False),
            _row("base", "direct", "t2", 0, True), _row("base", "direct", "t2", 1, True),
            _row("base", "direct", "t3", 0, False), _row("base", "direct", "t3", 1, False, status="infra_error"),
            _row("base", "direct", "t2", 1, False, status="infra_error", retry=0)]
    rows[3]["retry"] = 1  # t2's second attempt: a retry replaced its infra error, and counts
    got = pass_at_1_intervals(rows, 4000, 0)
    est, lo, hi, n = got[("base", "direct")]
    assert n == 3 and est == pytest.approx((0.5 + 1.0 + 0.0) / 3)  # t3: one graded attempt, unsolved
    # the percentile bootstrap of the three task shares, recomputed
    d = np.array([0.5, 1.0, 0.0])
    boot = d[np.random.default_rng(0).integers(0, 3, size=(4000, 3), dtype=np.int32)].mean(axis=1)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))
    assert lo < est < hi and 0.0 <= lo and hi <= 1.0


def _con(name, a, b, est, lo, hi, n=12, status="ok"):
    return {"name": name, "a_checkpoint": a[0], "a_harness": a[1], "b_checkpoint": b[0], "b_harness": b[1],
            "estimate": est, "ci_low": lo, "ci_high": hi, "n_tasks": n, "status": status}


def test_the_reading_says_which_differences_the_evaluation_resolves():
    text = reading([_con("h", ("base", "direct"), ("base", "react-python"), 0.25, 0.05, 0.45),
                    _con("t", ("final", "direct"), ("base", "direct"), 0.02, -0.1, 0.14),
                    _con("x", ("final", "react-python"), ("base", "react-python"), None, None, None, 0,
                         "cell_not_counted")])
    assert text.startswith("On the same 12 held-out tasks, ")
    assert ("the harness (direct vs react-python, base policy) moved pass@1 by +0.250 [+0.050, +0.450], "
            "a difference this evaluation resolves") in text
    assert "training (base -> final, under direct) moved pass@1 by +0.020 [-0.100, +0.140], not resolved" in text
    assert "training (base -> final, under react-python): n/a (cell_not_counted)" in text
    # an interval below 0 is resolved too
    assert "resolves" in reading([_con("t", ("final", "direct"), ("base", "direct"), -0.3, -0.5, -0.1)])
    assert reading([]) == ""
    # contrasts over different task sets (a suite each) do not claim "the same" tasks
    mixed = reading([_con("a", ("final", "direct"), ("base", "direct"), 0.1, 0.0, 0.2, n=40),
                     _con("b", ("final", "boxed"), ("base", "boxed"), 0.1, 0.0, 0.2, n=12)])
    assert mixed.startswith("On the held-out tasks each compares, ") and "at 40 tasks" in mixed and "at 12 tasks" in mixed
