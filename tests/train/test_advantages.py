import math

import pytest
import torch

from tasks.rollout.groups import group_ids
from tasks.train.advantages import group_advantages, zero_signal_fraction


def test_grpo_advantage_matches_formula():
    r = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.2]
    g = ["a", "a", "a", "a", "b", "b", "c"]
    adv = group_advantages(r, g, scale="std", eps=1e-6)
    ga = torch.tensor([1.0, 0.0, 0.0, 1.0])
    want = (ga - 0.5) / (ga.std(unbiased=True) + 1e-6)  # std = 0.57735
    assert torch.allclose(adv[:4], want, atol=1e-6)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6), rel=1e-6)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0]  # equal rewards and a singleton: exactly 0


def test_dr_grpo_has_no_std_division():
    adv = group_advantages([1.0, 0.0, 0.0], ["g"] * 3, scale="none")
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_rewards_that_always_sum_to_a_constant_give_zero_not_nan():
    # case 5a: several reward functions whose per-sample sums are equal across the group
    parts = torch.tensor([[0.3, 0.7], [0.1, 0.9], [0.6, 0.4], [1.0, 0.0]], dtype=torch.float64)
    total = parts.sum(-1)  # 1.0 each, but with float rounding differences possible
    adv = group_advantages(total, ["g"] * 4)
    assert not torch.isnan(adv).any()
    assert adv.abs().max().item() == 0.0
    assert zero_signal_fraction(adv, ["g"] * 4) == 1.0


def test_group_of_one_is_zero():
    assert group_advantages([0.9], ["only"]).tolist() == [0.0]


def test_group_ids_within_and_cross():
    assert group_ids(["t1", "t1", "t2"], ["h1", "h2", "h1"], "within") == ["t1|h1", "t1|h2", "t2|h1"]
    assert group_ids(["t1", "t1", "t2"], ["h1", "h2", "h1"], "cross") == ["t1", "t1", "t2"]
    with pytest.raises(ValueError, match="mode"):
        group_ids(["t"], ["h"], "sideways")  # type: ignore[arg-type]


def test_cross_pools_harnesses_into_one_group():
    t, h = ["x"] * 4, ["A", "A", "B", "B"]
    r = [1.0, 1.0, 0.0, 0.0]
    within = group_advantages(r, group_ids(t, h, "within"))
    cross = group_advantages(r, group_ids(t, h, "cross"))
    assert within.tolist() == [0.0] * 4  # each (task, harness) group is constant
    assert cross[0] > 0 > cross[2]  # pooled: harness A looks better, the harness identity leaks


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([float("nan"), 1.0], ["a", "a"])
    with pytest.raises(ValueError, match="2 entries"):
        group_advantages([1.0, 0.0], ["a"])


def test_residualized_rewards_subtract_leave_one_task_out_harness_means():
    from tasks.train.advantages import residualized_rewards

    t = ["x", "x", "y", "y", "z"]
    h = ["A", "B", "A", "B", "A"]
    r = [1.0, 0.0, 0.5, 0.0, 0.0]
    res = residualized_rewards(r, t, h)
    # harness A on task x: other tasks' A rewards are {0.5, 0.0} -> baseline 0.25
    assert res.tolist() == pytest.approx([0.75, 0.0, 0.0, 0.0, -0.75])


def test_residualized_cross_removes_a_constant_harness_offset():
    from tasks.train.advantages import advantages_for

    # harness A always scores 0.5 more than B: that gap is the harness identity, not the task
    t = ["x", "x", "y", "y", "z", "z"]
    h = ["A", "B", "A", "B", "A", "B"]
    r = [0.6, 0.1, 0.9, 0.4, 0.7, 0.2]
    plain, _ = advantages_for(r, t, h, "cross")
    resid, _ = advantages_for(r, t, h, "cross_residualized")
    assert plain[0] > 0 > plain[1]
    assert resid.abs().max().item() < 1e-9  # equal up to float rounding; eps keeps it tiny


def _groups_sum_to_zero(adv, groups):
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        assert abs(float(adv[idx].double().sum())) < 1e-5, (g, adv[idx].tolist())


def test_coverage_matched_cross_keeps_whole_groups_up_to_withins_count():
    from tasks.train.advantages import advantages_for, coverage_matched_mask

    # 6 tasks x 2 harnesses x 2 samples. Within non-zero: tasks whose (task, harness) pairs disagree.
    t = [f"x{i}" for i in range(6) for _ in range(4)]
    h = ["A", "A", "B", "B"] * 6
    r = [1, 0, 0, 0,   1, 1, 0, 0,   1, 0, 1, 0,   0, 0, 0, 0,   1, 1, 1, 0,   1, 1, 0, 1]
    r = [float(v) for v in r]
    within, _ = advantages_for(r, t, h, "within")
    cross, g = advantages_for(r, t, h, "cross")
    # by hand: within non-zero groups (x0,A) (x2,A) (x2,B) (x4,B) (x5,B) -> 10 samples; cross: x0..x5 but x3 -> 20
    n_w = int((within != 0).sum())
    assert n_w == 10 and int((cross != 0).sum()) == 20
    for seed in range(20):
        matched, _ = advantages_for(r, t, h, "cross_coverage_matched", seed=seed)
        keep = coverage_matched_mask(within, cross, g, seed=seed)
        kept_groups = {gid for gid, k in zip(g, keep.tolist()) if k}
        # whole groups: a group is kept with every sample or dropped with every sample
        assert all(keep[i] == (g[i] in kept_groups) for i in range(len(g)))
        assert torch.equal(matched[keep], cross[keep]) and not matched[~keep].any()
        # groups of 4 non-zero samples each, target 10: first fit keeps exactly 2 of them
        assert int((matched != 0).sum()) == 8 and len(kept_groups) == 2
        _groups_sum_to_zero(matched, g)
    seen = {tuple(coverage_matched_mask(within, cross, g, seed=s).tolist()) for s in range(20)}
    assert len(seen) > 1  # the seed chooses which groups
    again, _ = advantages_for(r, t, h, "cross_coverage_matched", seed=7)
    assert torch.equal(advantages_for(r, t, h, "cross_coverage_matched", seed=7)[0], again)


def test_coverage_matched_first_fit_fills_with_a_smaller_group_and_keeps_all_when_cross_has_less():
    from tasks.train.advantages import coverage_matched_mask

    # cross groups: a (3 non-zero), b (2 non-zero), c (all zero); within count 2
    g = ["a", "a", "a", "b", "b", "c", "c"]
    cross = torch.tensor([0.5, 0.5, -1.0, 0.7, -0.7, 0.0, 0.0])
    within = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    for seed in range(10):  # whatever the order, only b fits under 2
        assert coverage_matched_mask(within, cross, g, seed=seed).tolist() == [False] * 3 + [True] * 2 + [False] * 2
    assert coverage_matched_mask(cross, within, g, seed=0).all()  # Cross (now 2 non-zero) <= target 5: keep all
    with pytest.raises(ValueError, match="differ in length"):
        coverage_matched_mask(within, cross, g[:-1], seed=0)


def test_group_ids_is_still_reachable_where_the_design_page_names_it():
    import tasks.rollout.groups
    import tasks.train.advantages

    assert tasks.train.advantages.group_ids is tasks.rollout.groups.group_ids
    assert tasks.train.advantages.group_ids(["t", "t"], ["a", "b"], "within") == ["t|a", "t|b"]
