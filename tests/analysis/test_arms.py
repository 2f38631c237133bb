"""Per-arm summaries: pass@1 per suite with intervals and median steps; training stability."""

import math

import pytest

from tasks.analysis.arms import suite_pass_rates, training_stability


def _row(ck, task, attempt, status, turns, retry=0, h="direct"):
    return {"checkpoint": ck, "harness_name": h, "record_id": f"r-{task}-{h}", "task_id": task, "attempt": attempt,
            "retry": retry, "status": status, "resolved": status == "resolved", "reward": float(status == "resolved"),
            "num_turns": turns}


def test_pass_rate_per_suite_with_interval_and_median_steps():
    evals = [
        _row("base", "a1", 0, "resolved", 2), _row("base", "a1", 1, "unresolved", 4),   # task a1: 1/2
        _row("base", "a2", 0, "resolved", 3), _row("base", "a2", 1, "resolved", 3),     # task a2: 2/2
        _row("base", "o1", 0, "infra_error", 9), _row("base", "o1", 0, "unresolved", 5, retry=1),  # retried: 0/1
        _row("base", "o1", 1, "timeout", 8),                                             # timeout: a failure
    ]
    suite_of = {"a1": "arith", "a2": "arith", "o1": "gsm"}
    rows = {r["suite"]: r for r in suite_pass_rates(evals, suite_of, resamples=500, seed=0)}
    assert rows["arith"]["pass_at_1"] == pytest.approx(0.75) and rows["arith"]["n_tasks"] == 2
    assert rows["arith"]["median_turns"] == 3.0 and rows["arith"]["graded"] == 4
    # two tasks with rates 0.5 and 1.0: every resample mean is 0.5, 0.75 or 1.0
    assert rows["arith"]["ci_low"] == 0.5 and rows["arith"]["ci_high"] == 1.0
    assert rows["gsm"]["pass_at_1"] == 0.0 and rows["gsm"]["graded"] == 2 and rows["gsm"]["median_turns"] == 6.5
    again = {r["suite"]: r for r in suite_pass_rates(evals, suite_of, resamples=500, seed=0)}
    assert again == rows
    with pytest.raises(ValueError, match="not in the tasks artifact"):
        suite_pass_rates(evals, {"a1": "arith"}, resamples=10, seed=0)


def _step(arm, step, kl, loss=0.1, reward=0.2):
    return {"arm": arm, "step": step, "loss": loss, "kl": kl, "grad_norm": 1.0, "reward_mean": reward}


def test_training_stability_flags_nan_and_divergence():
    steps = [_step("ok", 1, 0.01, reward=0.1), _step("ok", 2, 0.02, reward=0.3),
             _step("nan", 1, 0.01), _step("nan", 2, math.nan, loss=math.nan),
             _step("big", 1, 0.5), _step("big", 2, 3.0)]
    rows = {r["arm"]: r for r in training_stability(steps, divergence_kl=1.0)}
    assert rows["ok"]["stable"] and rows["ok"]["reason"] == "" and rows["ok"]["final_reward"] == 0.3
    assert rows["ok"]["first_reward"] == 0.1 and rows["ok"]["max_kl"] == 0.02
    assert not rows["nan"]["stable"] and rows["nan"]["nonfinite_steps"] == 1 and "step(s) [2]" in rows["nan"]["reason"]
    assert not rows["big"]["stable"] and "KL 3 > 1" in rows["big"]["reason"]


def test_training_stability_nan_kl_without_kl_term_is_stable_but_inf_kl_is_not():
    """The trainer writes KL NaN when no KL is computed (beta 0): not instability. An infinite KL
    or a NaN gradient norm is."""
    steps = [_step("nokl", 1, math.nan), _step("nokl", 2, math.nan),
             _step("infkl", 1, math.inf),
             {**_step("nangrad", 1, math.nan), "grad_norm": math.nan}]
    rows = {r["arm"]: r for r in training_stability(steps, divergence_kl=1.0)}
    assert rows["nokl"]["stable"] and rows["nokl"]["max_kl"] is None and rows["nokl"]["nonfinite_steps"] == 0
    assert not rows["infkl"]["stable"] and rows["infkl"]["nonfinite_steps"] == 1
    assert not rows["nangrad"]["stable"] and "step(s) [1]" in rows["nangrad"]["reason"]


def test_the_preregistered_rule_flags_a_reward_collapse_and_a_gradient_out_of_its_band():
    rule = {"window": 2, "reward_collapse": 0.5, "grad_norm_factor": 10.0}
    rewards = {"steady": [0.2, 0.2, 0.25, 0.3, 0.2, 0.15], "collapse": [0.3, 0.2, 0.2, 0.1, 0.1, 0.1],
               "spike": [0.2] * 6}
    steps = [{**_step(arm, i, 0.01, reward=r), "grad_norm": 50.0 if (arm == "spike" and i == 4) else 2.0 + i % 2}
             for arm, rs in rewards.items() for i, r in enumerate(rs)]
    rows = {r["arm"]: r for r in training_stability(steps, divergence_kl=1.0, rule=rule)}
    # steady: early (0.2 + 0.2) / 2 = 0.2, late (0.2 + 0.15) / 2 = 0.175 >= 0.1; grad norms 2-3 (median 2.5)
    assert rows["steady"]["stable"] and rows["steady"]["late_reward"] == pytest.approx(0.175)
    assert rows["steady"]["early_grad_norm"] == pytest.approx(2.5) and rows["steady"]["max_grad_norm"] == 3.0
    # collapse: early 0.25, late 0.1 < 0.5 x 0.25
    assert not rows["collapse"]["stable"] and "reward collapsed" in rows["collapse"]["reason"]
    assert rows["collapse"]["early_reward"] == pytest.approx(0.25)
    # spike: 50 > 10 x 2.5
    assert not rows["spike"]["stable"] and "grad norm 50 > 10 x early median 2.5" in rows["spike"]["reason"]
    # without the rule only finiteness and the KL threshold count: all three stable
    assert all(r["stable"] for r in training_stability(steps, divergence_kl=1.0))


def test_the_beta_rule_takes_the_smallest_beta_that_halves_the_drift():
    from tasks.analysis.arms import choose_kl_beta

    kl = {"b0": [0.01, 0.02, 0.03, 0.04, 0.05], "b1": [0.01, 0.02, 0.03, 0.03, 0.03],
          "b2": [0.01, 0.01, 0.02, 0.02, 0.02], "b3": [0.01, 0.01, 0.01, 0.01, 0.01]}
    steps = [{"arm": a, "step": i, "kl": v} for a, vs in kl.items() for i, v in enumerate(vs)]
    beta = {"b0": 0.001, "b1": 0.05, "b2": 0.3, "b3": 1.0}
    got = choose_kl_beta(steps, beta, "b0")
    # L: b0 0.04, b1 0.03 (> 0.02), b2 0.02 (at most half), b3 0.01 -> the smallest qualifying beta is 0.3
    assert got["beta"] == 0.3 and got["rule_met"] and got["anchor_kl"] == pytest.approx(0.04)
    assert got["late_kl"]["b1"] == pytest.approx(0.03) and got["late_kl"]["b2"] == pytest.approx(0.02)
    none = choose_kl_beta([s for s in steps if s["arm"] in ("b0", "b1")], {"b0": 0.001, "b1": 0.05}, "b0")
    assert none == {**none, "beta": 0.05, "rule_met": False}  # no candidate halves it: the largest
    with pytest.raises(ValueError, match="needs 3 steps with a measured KL"):
        choose_kl_beta(steps + [{"arm": "nokl", "step": i, "kl": math.nan} for i in range(5)],
                       {**beta, "nokl": 0.0}, "b0")
    assert got["held"][0.3] == pytest.approx(0.5) and got["anchor_drifted"]
    # an anchor that barely drifted: no beta can hold it, whatever the ratios say
    flat = choose_kl_beta(steps, beta, "b0", min_anchor_kl=0.05)
    assert flat["beta"] == 1.0 and not flat["rule_met"] and not flat["anchor_drifted"]


def test_the_beta_rule_averages_each_beta_over_its_training_seeds():
    from tasks.analysis.arms import choose_kl_beta

    # two seeds a beta: b1's seeds 0.03 and 0.01 average 0.02 (half the anchor's 0.04: chosen); taken
    # alone, seed 0 (0.03) would not qualify, and b2 (0.012) would be chosen
    late = {"b0@s0": 0.05, "b0@s1": 0.03, "b1@s0": 0.03, "b1@s1": 0.01, "b2@s0": 0.012, "b2@s1": 0.012}
    steps = [{"arm": a, "step": i, "kl": v} for a, v in late.items() for i in range(5)]
    beta = {"b0@s0": 0.001, "b0@s1": 0.001, "b1@s0": 1.0, "b1@s1": 1.0, "b2@s0": 4.0, "b2@s1": 4.0}
    got = choose_kl_beta(steps, beta, "b0@s0", last=5)
    assert got["anchor_kl"] == pytest.approx(0.04) and got["beta_kl"][1.0] == pytest.approx(0.02)
    assert got["beta"] == 1.0 and got["rule_met"] and got["held"][4.0] == pytest.approx(0.3)
    only_s0 = choose_kl_beta(steps, {k: v for k, v in beta.items() if k.endswith("s0")}, "b0@s0", last=5)
    assert only_s0["beta"] == 4.0 and only_s0["anchor_kl"] == pytest.approx(0.05)
