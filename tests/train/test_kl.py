import math

import pytest
import torch

from tasks.train.kl import (importance_weighted, kl_estimate, kl_in_loss, kl_in_reward, kl_loss_term,
                            kl_penalized_rewards)
from tasks.train.losses import agg_loss


def test_estimators_on_known_values():
    logp = torch.tensor([math.log(0.5), math.log(0.25)])
    ref = torch.tensor([math.log(0.25), math.log(0.5)])
    lr = ref - logp  # [-log 2, +log 2]
    assert torch.allclose(kl_estimate(logp, ref, "k1"), -lr)
    assert torch.allclose(kl_estimate(logp, ref, "k2"), 0.5 * lr**2)
    assert torch.allclose(kl_estimate(logp, ref, "k3"), torch.exp(lr) - 1 - lr)
    assert kl_estimate(logp, ref, "k3")[0].item() == pytest.approx(0.5 - 1 + math.log(2))


def test_expectations_match_exact_kl_for_k1_and_k3():
    # exact KL(p || q) for categoricals vs the expectation of each estimator under p
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    exact = float((p * (p / q).log()).sum())
    logp, ref = p.log(), q.log()
    e_k1 = float((p * kl_estimate(logp, ref, "k1")).sum())
    e_k3 = float((p * kl_estimate(logp, ref, "k3")).sum())
    e_k2 = float((p * kl_estimate(logp, ref, "k2")).sum())
    assert e_k1 == pytest.approx(exact, rel=1e-6)
    assert e_k3 == pytest.approx(exact, rel=1e-6)
    assert e_k2 != pytest.approx(exact, rel=1e-3)  # k2 is biased


def test_k3_is_finite_for_huge_ratios_and_nonnegative():
    logp = torch.tensor([-100.0, 0.0, -1e-3])
    ref = torch.tensor([0.0, -100.0, -1e-3])
    k3 = kl_estimate(logp, ref, "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    assert k3[2].item() == 0.0


def test_unknown_kind_and_shape_mismatch():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        kl_estimate(torch.zeros(2), torch.zeros(3), "k1")


def test_one_step_on_kl_only_loss_lowers_kl():
    # case 5d: the sign is right
    torch.manual_seed(0)
    ref_logits = torch.randn(6)
    logits = torch.randn(6, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=0.5)

    def exact_kl():
        p, q = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
        return float((p.exp() * (p - q)).sum())

    before = exact_kl()
    p = torch.log_softmax(logits, -1)
    q = torch.log_softmax(ref_logits, -1)
    # E_p[k2] differentiated pathwise (weights detached) is exactly the reverse-KL gradient (P5)
    loss = (p.exp().detach() * kl_estimate(p, q, "k2")).sum()
    loss.backward()
    opt.step()
    assert exact_kl() < before


@pytest.mark.parametrize("placement, beta, reward, loss", [
    ("reward", 0.1, True, False), ("loss", 0.1, False, True), ("both", 0.1, True, True),
    ("reward", 0.0, False, False), ("both", 0.0, False, False),
])
def test_placement_says_where_the_kl_term_goes(placement, beta, reward, loss):
    assert (kl_in_reward(beta, placement), kl_in_loss(beta, placement)) == (reward, loss)


def test_an_unknown_placement_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^train.kl.placement='token' is not one of \('reward', 'loss', 'both'\)$"):
        kl_in_loss(0.1, "token")


def test_penalized_rewards_subtract_beta_times_the_summed_masked_estimate():
    # sequence 0: tokens log-ratios +-log 2 (k1 sums to 0 over both, but the second is masked out)
    logp = [torch.tensor([math.log(0.5), math.log(0.25)]), torch.tensor([math.log(0.5)])]
    ref = [torch.tensor([math.log(0.25), math.log(0.5)]), torch.tensor([math.log(0.5)])]
    masks = [torch.tensor([1.0, 0.0]), torch.tensor([1.0])]
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    out, mean_pen = kl_penalized_rewards(rewards, logp, ref, masks, "k1", 0.5)
    # k1 = logp - ref = log 2 on sequence 0's first token, 0 on sequence 1
    assert out.dtype == torch.float64
    assert out.tolist() == pytest.approx([1.0 - 0.5 * math.log(2), 0.0])
    assert mean_pen == pytest.approx(0.5 * math.log(2) / 2)
    assert kl_penalized_rewards(rewards, logp, ref, masks, "k1", 0.0)[0].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("weighted", [False, True])
def test_loss_term_is_beta_times_the_aggregated_estimate(weighted):
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -0.1]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.2, -0.4], [-0.9, -0.6, -3.0]])
    old = torch.tensor([[-0.6, -1.1, -1.0], [-0.2, -0.5, -0.3]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    k = kl_estimate(logp, ref, "k3", mask=mask)
    got = kl_loss_term(k, logp, old, mask, beta=0.2, weighted=weighted, agg="token_mean", max_len=None,
                       num_tokens=3.0, num_seqs=2.0)
    per_token = importance_weighted(k, logp, old, mask) if weighted else k
    want = 0.2 * agg_loss(per_token, mask, "token_mean", num_tokens=3.0, num_seqs=2.0)
    assert float(got) == float(want) and float(got) > 0
    # by hand, unweighted: beta * sum of the three unmasked k3 values / 3 tokens
    if not weighted:
        assert float(got) == pytest.approx(0.2 * float(k[mask.bool()].sum()) / 3)
    got.backward()
    assert logp.grad is not None and float(logp.grad[0, 2]) == 0.0 and float(logp.grad[1, 0]) != 0.0
