"""``plan_batches``: length-bucketed generation batches (tasks/rollout/engines/hf.py), and
``HFPolicy.generate`` returning completions in the prompts' order whatever the plan."""

from __future__ import annotations

import itertools

import pytest

from tasks.rollout.engines.hf import plan_batches


def brute_force(lengths, max_rows, overhead):
    """The least cost over every cut of the sorted lengths into runs of at most max_rows."""
    ls = sorted(lengths)
    n, best = len(ls), None
    for mask in itertools.product([0, 1], repeat=max(0, n - 1)):
        cuts = [0] + [i + 1 for i, m in enumerate(mask) if m] + [n]
        runs = [ls[a:b] for a, b in zip(cuts, cuts[1:])]
        if any(len(r) > max_rows for r in runs):
            continue
        cost = sum(len(r) * r[-1] + overhead for r in runs)
        best = cost if best is None else min(best, cost)
    return best


def cost(plan, lengths, overhead):
    return sum(len(rows) * max(lengths[i] for i in rows) + overhead for rows in plan)


def test_one_long_prompt_gets_its_own_batch():
    lengths = [120] * 26 + [764]
    plan = plan_batches(lengths, 32, 1536)
    assert plan == [list(range(26)), [26]]  # 26 x 120 + 764 + 2 x 1536 < 27 x 764 + 1536
    # a larger batch cost keeps them together
    assert plan_batches(lengths, 32, 20_000) == [list(range(27))]


@pytest.mark.parametrize("max_rows,overhead", [(1, 0), (2, 5), (3, 40), (4, 0), (4, 1000), (8, 12)])
@pytest.mark.parametrize("seed", range(4))
def test_plan_is_the_least_cost_cover(max_rows, overhead, seed):
    import random

    rng = random.Random(seed)
    lengths = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 11))]
    plan = plan_batches(lengths, max_rows, overhead)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))  # each prompt once
    assert all(1 <= len(rows) <= max_rows for rows in plan)
    assert cost(plan, lengths, overhead) == brute_force(lengths, max_rows, overhead)
    assert plan == plan_batches(lengths, max_rows, overhead)  # deterministic


def test_rows_keep_the_prompts_order():
    # sorted by length to cut, but each batch lists its prompts as the caller gave them: one batch
    # is the unplanned batch, row for row (the sampler's draws depend on the row)
    assert plan_batches([30, 5, 20, 6], 4, 10**6) == [[0, 1, 2, 3]]
    assert plan_batches([30, 5, 20, 6], 2, 10) == [[1, 3], [0, 2]]  # 12 + 60 + 2 x 10 = 92, the least


def test_ties_keep_arrival_order_and_empty_input():
    assert plan_batches([7, 7, 7], 2, 100) == [[0], [1, 2]]
    assert plan_batches([], 4, 10) == []


@pytest.mark.parametrize("max_rows,overhead,field", [(0, 1, "max_rows"), (2, -1, "overhead_tokens")])
def test_bad_arguments_name_the_field(max_rows, overhead, field):
    with pytest.raises(ValueError, match=field):
        plan_batches([1, 2], max_rows, overhead)


def test_generate_returns_completions_in_prompt_order(tiny_model_dir):
    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy

    cfg = PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=4, batch_overhead_tokens=0)
    policy = HFPolicy(tiny_model_dir, cfg, base_model_id="tiny")
    greedy = SamplingSpec(temperature=1e-4, top_p=1.0, top_k=1, max_new_tokens=3)
    prompts = [[5] * 9, [6, 7], [8] * 5, [6, 7]]
    together = policy.generate(prompts, greedy, 0)  # overhead 0: three batches, sorted by length
    alone = [policy.generate([p], greedy, 0)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert together[1].token_ids == together[3].token_ids
