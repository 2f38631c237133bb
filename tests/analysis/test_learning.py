"""Learning curves: sealed pass@1 of base, snapshots and final against the training step."""

import pytest

from tasks.analysis.learning import checkpoint_arms, learning_curve
from tests.analysis._rows import counts

CKPTS = [{"name": "base", "step": 0}, {"name": "final-step2", "step": 2}, {"name": "final", "step": 4},
         {"name": "other", "step": 4}]


def _evals():
    rows = []
    for ck, solved in (("base", [0, 1, 0, 0]), ("final-step2", [1, 1, 0, 0]), ("final", [2, 2, 1, 0])):
        for t, c in enumerate(solved):
            rows += counts(ck, "direct", f"t{t}", 2, c)
    return rows


def test_points_are_ordered_by_step_with_hand_values_and_window_rewards():
    steps = [{"arm": "final", "step": s, "reward_mean": r} for s, r in ((1, 0.1), (2, 0.3), (3, 0.5), (4, 0.7))]
    rows = learning_curve(_evals(), CKPTS, steps, ["final", "other"], resamples=200, seed=0)
    got = [(r["checkpoint"], r["step"], r["pass_at_1"], r["train_reward"]) for r in rows]
    # pass@1 = mean over tasks of resolved / graded: base 1/8, step 2: 2/8, final 5/8
    assert got == [("base", 0, 0.125, None), ("final-step2", 2, 0.25, pytest.approx(0.2)),
                   ("final", 4, 0.625, pytest.approx(0.6))]
    assert all(r["ci_low"] <= r["pass_at_1"] <= r["ci_high"] for r in rows)
    assert rows == learning_curve(_evals(), CKPTS, steps, ["final", "other"], resamples=200, seed=0)


def test_snapshot_names_map_to_their_arm_only():
    assert checkpoint_arms(CKPTS + [{"name": "x-step3", "step": 3}], ["final", "other"]) == {
        "final-step2": ("final", 2), "final": ("final", 4), "other": ("other", 4)}
    with pytest.raises(ValueError, match="resamples"):
        learning_curve(_evals(), CKPTS, [], ["final"], resamples=0, seed=0)
