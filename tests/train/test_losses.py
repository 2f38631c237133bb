import math

import pytest
import torch

from tasks.train.losses import agg_loss, policy_loss, sequence_log_ratio


def _batch():
    torch.manual_seed(0)
    logp = (torch.randn(3, 5) * 0.1 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(3, 5) * 0.2
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 2.0])
    return logp, old, mask, adv


def test_token_level_grpo_matches_hand_formula():
    logp, old, mask, adv = _batch()
    loss, met = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token_mean")
    ratio = torch.exp(logp.detach() - old)
    per = torch.maximum(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.28))
    want = (per * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    clipped = ((-adv[:, None] * ratio.clamp(0.8, 1.28)) > (-adv[:, None] * ratio)).float()
    assert met["clip_frac"] == pytest.approx(float((clipped * mask).sum() / mask.sum()))


def test_aggregations_differ_as_defined():
    v = torch.tensor([[1.0, 1.0, 0.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert agg_loss(v, m, "token_mean").item() == pytest.approx(6.0 / 3)
    assert agg_loss(v, m, "seq_mean_token_mean").item() == pytest.approx((1.0 + 4.0) / 2)
    assert agg_loss(v, m, "seq_mean_token_sum_norm", max_len=4).item() == pytest.approx((2.0 / 4 + 4.0 / 4) / 2)
    with pytest.raises(ValueError, match="max_len"):
        agg_loss(v, m, "seq_mean_token_sum_norm")


def test_masked_out_sequence_is_in_no_denominator():
    # case 5b: a truncated completion masked out entirely changes no denominator
    v = torch.tensor([[2.0, 2.0], [9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    for agg in ("token_mean", "seq_mean_token_mean"):
        assert agg_loss(v, m, agg).item() == pytest.approx(2.0)
    assert agg_loss(v, m, "seq_mean_token_sum_norm", max_len=2).item() == pytest.approx(2.0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batch_split_gives_the_big_batch_loss_and_gradient(agg):
    # case 5e: a 1-token and a 9-token sequence, every split
    torch.manual_seed(1)
    logits = torch.randn(2, 9, requires_grad=True)
    old = torch.randn(2, 9) * 0.1 - 1
    mask = torch.zeros(2, 9)
    mask[0, 0] = 1
    mask[1, :] = 1
    adv = torch.tensor([1.5, -0.7])
    kw = dict(agg=agg, max_len=9)

    def logp_of(lg):
        return torch.nn.functional.logsigmoid(lg) - 1.0

    full, _ = policy_loss(logp_of(logits), old, adv, mask, **kw)
    (g_full,) = torch.autograd.grad(full, logits)
    n_tok, n_seq = float(mask.sum()), 2.0
    total = 0.0
    grads = torch.zeros_like(logits)
    for rows in ([0], [1]):
        lg = logits.detach()[rows].clone().requires_grad_()
        part, _ = policy_loss(logp_of(lg), old[rows], adv[rows], mask[rows], num_tokens=n_tok, num_seqs=n_seq, **kw)
        (g,) = torch.autograd.grad(part, lg)
        grads[rows] = g
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(grads, g_full, atol=1e-7)


def test_gspo_sequence_ratio_is_length_normalised_and_clipped():
    # case 5g: 500 tokens, per-token log-ratio 0.01 and 1.0: finite, in log space, clipped
    T = 500
    mask = torch.ones(2, T)
    old = torch.zeros(2, T)
    logp = torch.stack([torch.full((T,), 0.01), torch.full((T,), 1.0)]).requires_grad_()
    log_s = sequence_log_ratio(logp, old, mask)
    assert log_s.tolist() == pytest.approx([0.01, 1.0])
    adv = torch.tensor([1.0, 1.0])
    loss, met = policy_loss(logp, old, adv, mask, level="sequence", clip_low=3e-4, clip_high=4e-4,
                            agg="seq_mean_token_mean")
    assert math.isfinite(loss.item())
    # both ratios exceed 1 + 4e-4 with A > 0: both clipped to 1.0004, zero gradient
    assert loss.item() == pytest.approx(-1.0004, rel=1e-6)
    assert met["clip_frac"] == 1.0
    loss.backward()
    assert logp.grad.abs().max().item() == 0.0


def test_gspo_token_equals_gspo_when_advantages_are_per_sequence():
    logp, old, mask, adv = _batch()
    l_seq, _ = policy_loss(logp, old, adv, mask, level="sequence", agg="seq_mean_token_mean", clip_low=10, clip_high=10)
    (g_seq,) = torch.autograd.grad(l_seq, logp)
    l_tok, _ = policy_loss(logp, old, adv, mask, level="sequence_token", agg="seq_mean_token_mean", clip_low=10, clip_high=10)
    (g_tok,) = torch.autograd.grad(l_tok, logp)
    assert l_tok.item() == pytest.approx(l_seq.item(), rel=1e-6)
    assert torch.allclose(g_tok, g_seq, atol=1e-6)


def test_gspo_refuses_other_aggregations():
    logp, old, mask, adv = _batch()
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        policy_loss(logp, old, adv, mask, level="sequence", agg="token_mean")


def test_zero_advantages_give_zero_loss_and_gradient():
    logp, old, mask, _ = _batch()
    loss, _ = policy_loss(logp, old, torch.zeros(3), mask)
    loss.backward()
    assert loss.item() == 0.0 and logp.grad.abs().max().item() == 0.0


LEVEL_AGGS = [("token", "token_mean"), ("token", "seq_mean_token_mean"), ("token", "seq_mean_token_sum_norm"),
              ("sequence", "seq_mean_token_mean"), ("sequence_token", "seq_mean_token_mean")]


def _dirty(x, mask, a, b):
    """``x`` with ``a`` and ``b`` written at alternating masked-out positions."""
    out = x.detach().clone()
    holes = (mask == 0).nonzero(as_tuple=True)
    vals = torch.tensor([a if k % 2 == 0 else b for k in range(len(holes[0]))], dtype=out.dtype)
    out[holes] = vals
    return out


@pytest.mark.parametrize("level,agg", LEVEL_AGGS)
@pytest.mark.parametrize("a,b", [(200.0, 300.0), (300.0, -200.0), (float("inf"), float("nan"))])
def test_values_at_masked_positions_change_nothing(level, agg, a, b):
    # exp(300 - (-200)) overflows to inf; before masking came first it gave a NaN loss and gradient
    logp, old, mask, adv = _batch()
    weights = torch.rand(3, 5) + 0.5 if level == "token" else torch.rand(3) + 0.5
    kw = dict(level=level, agg=agg, max_len=5, clip_low=0.2, clip_high=0.28, weights=weights)
    clean = logp.detach().clone().requires_grad_()
    l_clean, m_clean = policy_loss(clean, old, adv, mask, **kw)
    (g_clean,) = torch.autograd.grad(l_clean, clean)
    dirty = _dirty(logp, mask, a, b).requires_grad_()
    l_dirty, m_dirty = policy_loss(dirty, _dirty(old, mask, b, a), adv, mask, **kw)
    (g_dirty,) = torch.autograd.grad(l_dirty, dirty)
    assert torch.isfinite(l_dirty) and l_dirty.item() == l_clean.item()
    assert torch.equal(g_dirty, g_clean) and m_dirty == m_clean


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_kl_terms_ignore_values_at_masked_positions(kind, agg):
    from tasks.train.kl import importance_weighted, kl_estimate

    logp, old, mask, _ = _batch()
    ref = old - 0.3

    def kl_loss(lp, rf, od):
        k = kl_estimate(lp, rf, kind, mask=mask)
        return agg_loss(importance_weighted(k, lp, od, mask), mask, agg, max_len=5)

    clean = logp.detach().clone().requires_grad_()
    l_clean = kl_loss(clean, ref, old)
    (g_clean,) = torch.autograd.grad(l_clean, clean)
    dirty = _dirty(logp, mask, 200.0, 300.0).requires_grad_()
    l_dirty = kl_loss(dirty, _dirty(ref, mask, -300.0, float("nan")), _dirty(old, mask, 300.0, -200.0))
    (g_dirty,) = torch.autograd.grad(l_dirty, dirty)
    assert torch.isfinite(l_dirty) and l_dirty.item() == l_clean.item() and torch.equal(g_dirty, g_clean)
    assert (kl_estimate(dirty, _dirty(ref, mask, -300.0, 1.0), kind, mask=mask)[mask == 0] == 0).all()


def test_truncated_importance_weights_on_a_known_mismatch():
    from tasks.train.losses import truncated_is_weights

    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3]]))
    beh = torch.log(torch.tensor([[0.25, 0.4, 0.1, 0.3]]))  # ratios 2, 0.5, 9 (masked: anything)
    w = truncated_is_weights(old, beh, mask, cap=3.0)
    assert w[0, :3].tolist() == pytest.approx([2.0, 0.5, 3.0]) and w[0, 3].item() == 1.0
    seq = truncated_is_weights(old, beh, mask, cap=3.0, level="sequence")
    assert seq.item() == pytest.approx(min((2.0 * 0.5 * 9.0) ** (1 / 3), 3.0))
    # the weight multiplies each token's loss: the gradient of a weighted token scales with it
    logp = old.clone().requires_grad_()
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, weights=w, agg="token_mean")
    loss.backward()
    assert (logp.grad[0, :3] / logp.grad[0, 0]).tolist() == pytest.approx([1.0, 0.25, 1.5])
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, beh, mask, cap=0.0)


def test_importance_ratio_weights_the_gradient_only_when_behaviour_differs():
    # d/dlogp of -rho A at rho = exp(logp - old): -A rho; equal to the REINFORCE gradient -A iff old = logp
    logp, old, mask, adv = _batch()
    wide = dict(clip_low=10.0, clip_high=10.0, agg="token_mean")
    on = logp.detach().clone().requires_grad_()
    l_on, _ = policy_loss(on, on.detach(), adv, mask, **wide)
    (g_on,) = torch.autograd.grad(l_on, on)
    assert torch.allclose(g_on, -adv[:, None] * mask / mask.sum())  # on-policy: plain policy gradient
    off = logp.detach().clone().requires_grad_()
    l_off, met = policy_loss(off, old, adv, mask, **wide)
    (g_off,) = torch.autograd.grad(l_off, off)
    rho = torch.exp(logp.detach() - old)
    assert torch.allclose(g_off, -adv[:, None] * rho * mask / mask.sum(), atol=1e-7)
    assert not torch.allclose(g_off, g_on) and met["ratio_min"] < 1.0 < met["ratio_max"]
