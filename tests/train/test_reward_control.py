"""The random-reward control: rewards with the information taken out, and the trainer using them."""

import pytest
import torch

from tasks.hashing import seed_from
from tasks.train.advantages import control_rewards
from tasks.train.trainer import Trainer
from tests.train.test_direction import PROMPT, _cfg, _quiet, _seq, _seq_logp


def test_shuffle_is_a_seeded_permutation_of_the_batch():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0])
    a, b = control_rewards(r, "shuffle", 7), control_rewards(r, "shuffle", 7)
    assert torch.equal(a, b) and a.dtype == torch.float64
    assert sorted(a.tolist()) == sorted(r.tolist())  # the batch's mean and spread stay
    others = {tuple(control_rewards(r, "shuffle", s).tolist()) for s in range(20)}
    assert len(others) > 5  # the seed decides which sample gets which reward


def test_bernoulli_draws_successes_at_the_batch_rate_whatever_the_samples_did():
    r = torch.tensor([1.0] * 250 + [0.0] * 750)
    c = control_rewards(r, "bernoulli", 3)
    assert set(c.tolist()) <= {0.0, 1.0}
    assert abs(float(c.mean()) - 0.25) < 0.05
    # independent of which samples succeeded: the agreement is chance (0.25^2 + 0.75^2 = 0.625)
    assert abs(float((c == r).double().mean()) - 0.625) < 0.06
    assert torch.equal(control_rewards(r, "none", 3), r.double())
    with pytest.raises(ValueError, match="reward_control='sign'"):
        control_rewards(r, "sign", 0)


def test_the_control_arm_trains_on_the_shuffled_rewards_and_logs_the_real_ones(tiny_model_dir):
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    tr = Trainer(_cfg(tiny_model_dir, reward_control="shuffle", max_len=8), tiny_model_dir, log=_quiet)
    comps = [[301, 302, 303], [410, 411, 412, 413], [520, 521], [630, 631, 632], [700, 701], [800, 801, 802]]
    seqs = [_seq(i, PROMPT, c, r) for i, (c, r) in enumerate(zip(comps, rewards))]
    shuffled = control_rewards(torch.tensor(rewards), "shuffle", seed_from(0, "reward-control", 0)).tolist()
    assert shuffled != rewards  # the seed used here does move rewards between samples
    before = _seq_logp(tr, seqs)
    b = tr.new_batch(seqs)
    assert b.rewards.tolist() == rewards and b.train_rewards.tolist() == shuffled
    row, _ = tr.step(b, list(range(len(seqs))))
    assert row["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    after = _seq_logp(tr, seqs)
    # the policy moves the way the *shuffled* rewards say: up where the control gave 1
    assert [lp1 > lp0 for lp0, lp1 in zip(before, after)] == [r == 1.0 for r in shuffled]
