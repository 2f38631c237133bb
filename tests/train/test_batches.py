"""Groups, mini-batches and the online task schedule (pure functions, no model)."""

import pytest
import torch

from tasks.train.advantages import advantages_for
from tasks.train.batches import minibatches, plan_groups


def _data():
    g = torch.Generator().manual_seed(0)
    tasks = [f"t{i // 4}" for i in range(24)]
    harnesses = ["A" if (i // 2) % 2 == 0 else "B" for i in range(24)]
    rewards = (torch.rand(24, generator=g) > 0.6).double().tolist()
    return rewards, tasks, harnesses


@pytest.mark.parametrize("grouping", ["within", "cross", "cross_coverage_matched", "cross_residualized"])
def test_plan_reproduces_the_full_batch_advantages_on_every_mini_batch(grouping):
    rewards, tasks, harnesses = _data()
    plan = plan_groups(rewards, tasks, harnesses, grouping, seed=3)
    want, gids = advantages_for(torch.tensor(rewards), tasks, harnesses, grouping, seed=3)
    assert plan.group_ids == gids
    assert torch.allclose(plan.advantages(torch.tensor(rewards), range(24)), want)
    for idx in minibatches(plan.groups, 2, seed=1):  # whole groups: the same advantages in any mini-batch
        assert torch.allclose(plan.advantages(torch.tensor(rewards)[idx], idx), want[idx])


def test_minibatches_hold_whole_groups_in_a_seeded_order():
    groups = [[0, 1, 2], [3, 4], [5], [6, 7, 8, 9], [10]]
    mbs = minibatches(groups, 2, seed=0)
    assert len(mbs) == 3 and sorted(i for m in mbs for i in m) == list(range(11))
    for m in mbs:
        assert all(set(g) <= set(m) or not set(g) & set(m) for g in groups)
    assert mbs == minibatches(groups, 2, seed=0) and mbs != minibatches(groups, 2, seed=1)
    whole = minibatches(groups, None, seed=0)  # no batch_size: one step over every group
    assert len(whole) == 1 and sorted(whole[0]) == list(range(11))
