import math

import pytest
import torch

from tasks.train.kl import kl_estimate


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
