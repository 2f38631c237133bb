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
