"""``benchmarks/_learning_stats.py`` (the statistics of ``benchmarks/learning.py``), each against
numbers worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _learning_stats import bootstrap_pass_at_1, first_crossing, snapshots_at_marks, time_ratio  # noqa: E402


def test_snapshots_at_marks_hold_the_last_iteration_finished_by_each_mark():
    its = [{"iterations": 1, "seconds": 30.0, "adapter": "a1"}, {"iterations": 2, "seconds": 70.0, "adapter": "a2"},
           {"iterations": 3, "seconds": 160.0, "adapter": "a3"}, {"iterations": 4, "seconds": 230.0, "adapter": "a4"}]
    # marks 50, 100, 150, 200: a1 (30 <= 50), a2 (70 <= 100), still a2 at 150, a3 (160 <= 200); a4 is past the budget
    got = snapshots_at_marks(its, 200.0, 4)
    assert [(s["mark_s"], s["iterations"], s["weights_s"], s["adapter"]) for s in got] == [
        (50.0, 1, 30.0, "a1"), (100.0, 2, 70.0, "a2"), (150.0, 2, 70.0, "a2"), (200.0, 3, 160.0, "a3")]
    # an iteration finishing exactly at a mark counts; before the first iteration the base model holds
    got = snapshots_at_marks([{"iterations": 1, "seconds": 100.0, "adapter": "x"}], 200.0, 4)
    assert [(s["iterations"], s["adapter"], s["weights_s"]) for s in got] == [(0, None, 0.0), (1, "x", 100.0),
                                                                              (1, "x", 100.0), (1, "x", 100.0)]


def test_snapshots_at_marks_refuses_bad_input():
    with pytest.raises(ValueError, match="budget_s=0"):
        snapshots_at_marks([], 0, 4)
    with pytest.raises(ValueError, match="n=0"):
        snapshots_at_marks([], 10.0, 0)
    with pytest.raises(ValueError, match="go backwards"):
        snapshots_at_marks([{"iterations": 1, "seconds": 5.0, "adapter": "a"},
                            {"iterations": 2, "seconds": 4.0, "adapter": "b"}], 10.0, 2)


def test_first_crossing_interpolates_between_snapshots():
    # 0.3 at 100 s, 0.5 at 200 s: 0.4 is half-way, 150 s
    assert first_crossing([(0, 0.2), (100, 0.3), (200, 0.5)], 0.4) == pytest.approx(150.0)
    # the first crossing counts, not a later one after a dip: 0.2 -> 0.45 over 0-100 s reaches 0.4 at 80 s
    assert first_crossing([(0, 0.2), (100, 0.45), (200, 0.3), (300, 0.5)], 0.4) == pytest.approx(80.0)
    # landing on the target exactly, and a base model already at the target
    assert first_crossing([(0, 0.2), (100, 0.4)], 0.4) == pytest.approx(100.0)
    assert first_crossing([(0, 0.5), (100, 0.6)], 0.4) == 0.0
    # never reached: censored, None (not the budget, not 0)
    assert first_crossing([(0, 0.2), (100, 0.39)], 0.4) is None


def test_first_crossing_refuses_bad_curves():
    with pytest.raises(ValueError, match="empty"):
        first_crossing([], 0.4)
    with pytest.raises(ValueError, match="not increasing"):
        first_crossing([(0, 0.1), (100, 0.2), (100, 0.5)], 0.4)


def test_time_ratio_of_mean_times_with_an_interval_over_seeds():
    # slow 300, 500 (mean 400); fast 100, 150 (mean 125): 3.2
    r = time_ratio([300.0, 500.0], [100.0, 150.0], 600.0, resamples=2000, seed=0)
    assert r["ratio"] == pytest.approx(3.2) and r["bound"] == "exact" and r["reason"] is None
    # fast seeds identical: each resample's ratio is 300/100, 400/100 or 500/100 (P = 1/4, 1/2, 1/4)
    r = time_ratio([300.0, 500.0], [100.0, 100.0], 600.0, resamples=2000, seed=0)
    assert r["ratio"] == pytest.approx(4.0) and (r["ci_low"], r["ci_high"]) == (pytest.approx(3.0), pytest.approx(5.0))


def test_time_ratio_censors_not_reached_at_the_budget_and_says_which_bound():
    # a slow seed that never reached it enters as the budget, 600: (600 + 500) / 2 / 125 = 4.4, a lower bound
    r = time_ratio([None, 500.0], [100.0, 150.0], 600.0, resamples=200)
    assert r["ratio"] == pytest.approx(4.4) and r["bound"] == "lower" and r["not_reached"] == {"slow": 1, "fast": 0}
    # a fast seed that never reached it: 400 / ((600 + 150) / 2) = 1.0667, an upper bound
    r = time_ratio([300.0, 500.0], [None, 150.0], 600.0, resamples=200)
    assert r["ratio"] == pytest.approx(400 / 375) and r["bound"] == "upper"
    # both: no figure, a reason
    r = time_ratio([None, 500.0], [None, 150.0], 600.0, resamples=200)
    assert r["ratio"] is None and r["ci_low"] is None and r["bound"] is None and "neither way" in r["reason"]


def test_time_ratio_undefined_cases_are_none_with_a_reason():
    r = time_ratio([300.0], [100.0], 600.0)
    assert r["ratio"] == pytest.approx(3.0) and r["ci_low"] is None and "at least 2 per side" in r["reason"]
    r = time_ratio([300.0, 200.0], [0.0, 0.0], 600.0)
    assert r["ratio"] is None and "base model already reaches it" in r["reason"]
    with pytest.raises(ValueError, match="both need at least 1"):
        time_ratio([], [1.0], 600.0)
    with pytest.raises(ValueError, match="negative time"):
        time_ratio([-1.0], [1.0], 600.0)


def test_bootstrap_pass_at_1_resamples_seeds_and_tasks():
    # two seeds, one all 0, one all 1: the tasks alone never move the mean off 0.5, the seeds do
    # (resampled means 0, 0.5, 1 with P = 1/4, 1/2, 1/4): an interval of [0, 1], not [0.5, 0.5]
    r = bootstrap_pass_at_1({"a": [[0, 0, 0, 0], [1, 1, 1, 1]]}, resamples=2000)
    assert r["a"]["pass_at_1"] == 0.5 and (r["a"]["ci_low"], r["a"]["ci_high"]) == (0.0, 1.0)
    assert r["a"]["seeds"] == 2 and r["a"]["reason"] is None
    # one seed, two tasks 0 and 1: the tasks move it (all-0 and all-1 draws have P = 1/4 each)
    r = bootstrap_pass_at_1({"a": [[0, 1]]}, resamples=2000)
    assert (r["a"]["ci_low"], r["a"]["ci_high"]) == (0.0, 1.0) and "tasks only" in r["a"]["reason"]
    # a constant: the interval is the point
    r = bootstrap_pass_at_1({"a": [[0.25, 0.25], [0.25, 0.25]]}, resamples=500)
    assert r["a"]["pass_at_1"] == r["a"]["ci_low"] == r["a"]["ci_high"] == 0.25


def test_bootstrap_pass_at_1_pairs_the_difference_by_task():
    # b is a + 0.5 on every task: drawn on the same tasks, every resample's difference is -0.5
    # exactly; drawn apart, it would spread over [-1.5, 0.5]
    r = bootstrap_pass_at_1({"a": [[0.0, 0.5, 0.0, 0.5]], "b": [[0.5, 1.0, 0.5, 1.0]]}, [("a", "b")], resamples=1000)
    d = r["a-b"]
    assert d["diff"] == pytest.approx(-0.5)
    assert d["ci_low"] == pytest.approx(-0.5) and d["ci_high"] == pytest.approx(-0.5)


def test_bootstrap_pass_at_1_refuses_bad_input():
    with pytest.raises(ValueError, match="task counts"):
        bootstrap_pass_at_1({"a": [[0, 1]], "b": [[0, 1, 1]]})
    with pytest.raises(ValueError, match="no group 'c'"):
        bootstrap_pass_at_1({"a": [[0, 1]]}, [("a", "c")])
    with pytest.raises(ValueError, match="group 'a'"):
        bootstrap_pass_at_1({"a": []})
