"""Which way one optimizer step moves the policy, on the tiny model with a known batch.

- the policy gradient: the log-prob of a positive-advantage sequence goes up, of a negative one
  down, for every objective and aggregation;
- the KL term alone (equal task rewards, so zero task advantage): for every estimator and
  placement the KL term the configuration optimises goes down (in the loss: the batch's estimate;
  in the reward: the importance-weighted penalty), and the exact KL to the reference at the
  batch's state goes down wherever P5 says the configuration's gradient descends it;
- importance weighting: it changes the update when the behaviour policy differs from the current
  one and leaves it unchanged when they are equal.
"""

import math

import pytest
import torch

from tasks.config import RunConfig
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import Trainer


def _cfg(model_dir, **train):
    t = {"lr": 0.02, "micro_batch_size": 8, "lora": {"r": 4, "alpha": 8}, "kl": {"beta": 0.0}, **train}
    return RunConfig.model_validate({"name": "d", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "policy": {"model": str(model_dir)}, "train": t})


def _quiet(_m):
    return None


def _seq(i, prompt, comp, reward, behaviour=None):
    ids = prompt + comp
    beh = behaviour if behaviour is not None else [-2.0] * len(comp)
    return TrainSequence(f"s{i}", ids, [0] * len(prompt) + [1] * len(comp), [0.0] * len(prompt) + list(beh), reward,
                         "task", "hash", "H", (1.0, 0, 1.0))


def _seq_logp(tr, seqs):
    lp = tr.passes(seqs, list(range(len(seqs))), "policy")
    return [float(lp[i].sum()) for i in range(len(seqs))]


PROMPT = [11, 52, 97, 140, 233]


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("grpo", "seq_mean_token_mean"),
                                           ("grpo", "seq_mean_token_sum_norm"), ("gspo", "seq_mean_token_mean"),
                                           ("gspo_token", "seq_mean_token_mean")])
def test_positive_advantage_goes_up_negative_goes_down(tiny_model_dir, algorithm, agg):
    tr = Trainer(_cfg(tiny_model_dir, algorithm=algorithm, agg=agg, max_len=8), tiny_model_dir, log=_quiet)
    comps = [[301, 302, 303], [410, 411, 412, 413], [520, 521], [630, 631, 632]]
    seqs = [_seq(i, PROMPT, c, r) for i, (c, r) in enumerate(zip(comps, [1.0, 0.0, 1.0, 0.0]))]
    before = _seq_logp(tr, seqs)
    b = tr.new_batch(seqs)
    assert b.static_adv.tolist()[0] > 0 > b.static_adv.tolist()[1]
    tr.step(b, list(range(4)))
    after = _seq_logp(tr, seqs)
    for s, lp0, lp1 in zip(seqs, before, after):
        assert (lp1 > lp0) == (s.reward == 1.0), (algorithm, agg, before, after)


# ---- KL only ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def away_from_reference(tiny_model_dir, tmp_path_factory):
    """A starting adapter whose policy at PROMPT is far from the base model's (random LoRA B)."""
    tr = Trainer(_cfg(tiny_model_dir), tiny_model_dir, log=_quiet)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in tr.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5)
    out = tmp_path_factory.mktemp("away")
    tr.save_adapter(out)
    return out


def _next_token(model, prompt):
    """log pi(. | prompt) over the vocabulary, float64 ``[V]``."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    return torch.log_softmax(logits, -1)


def _exact_kl(tr):
    """KL(pi_theta(. | PROMPT) || pi_ref(. | PROMPT)), nats, by enumeration of the vocabulary."""
    lp = _next_token(tr.model, PROMPT)
    with tr.model.disable_adapter():
        lr = _next_token(tr.model, PROMPT)
    return float((lp.exp() * (lp - lr)).sum())


# P5 (docs/methods/p5-kl.md): configurations whose gradient is unbiased for the reverse KL (k1 in reward, k1 or k3
# in both), token-level unbiased (k2 in loss) or a forward-KL gradient (k3 in loss). The others are biased
# (k2 / k3 in reward) or zero in expectation (k1 in loss, "beta = 0 plus noise"); on a finite batch
# their step can raise the exact KL, and it does here (measured: k1/loss, k2/reward, k3/reward
# raise it by 1-3%), so for them only the term each configuration optimises is required to fall.
DESCENDS_EXACT_KL = {("k1", "reward"), ("k2", "loss"), ("k3", "loss"), ("k1", "both"), ("k3", "both")}


def _kl_terms(tr, b, seqs, estimator, lp_old):
    """The two KL terms a step can optimise, measured by the test, not by the trainer: in the loss,
    the batch mean of k_t(theta', ref) on the sampled tokens (pathwise); in the reward, the
    importance-weighted penalty mean_i rho_i (P_i - mean P) with P_i = sum_t k_t(theta, ref) frozen
    at the batch's policy and rho_i = pi_theta'(y_i) / pi_theta(y_i) (the score-function part)."""
    from tasks.train.kl import kl_estimate

    idx = list(range(len(seqs)))
    lp = tr.passes(seqs, idx, "policy")
    masks = [torch.tensor(s.mask[1:], dtype=torch.float32) for s in seqs]
    k_new = torch.stack([kl_estimate(lp[i], b.ref[i], estimator, mask=masks[i]).sum() for i in idx])
    pen = torch.stack([kl_estimate(lp_old[i], b.ref[i], estimator, mask=masks[i]).sum() for i in idx])
    rho = torch.stack([torch.exp((lp[i] - lp_old[i]) @ masks[i]) for i in idx])
    return float(k_new.mean()), float((rho * (pen - pen.mean())).mean())


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("placement", ["reward", "loss", "both"])
def test_kl_term_alone_moves_the_policy_towards_the_reference(tiny_model_dir, away_from_reference, estimator,
                                                              placement):
    # lr 1e-4: AdamW's first step moves every LoRA weight by about lr (sign descent), so a step that
    # is small in function space needs a small lr (1e-3 already overshoots the minimum here)
    cfg = _cfg(tiny_model_dir, init_adapter=str(away_from_reference), reference="base", lr=1e-4,
               kl={"estimator": estimator, "placement": placement, "beta": 1.0}, agg="seq_mean_token_mean")
    tr = Trainer(cfg, tiny_model_dir, log=_quiet)
    # 64 one-token completions sampled from the current policy; every task reward equal (0 advantage)
    g = torch.Generator().manual_seed(1)
    toks = torch.multinomial(_next_token(tr.model, PROMPT).exp().float(), 64, replacement=True, generator=g)
    seqs = [_seq(i, PROMPT, [int(t)], 0.5) for i, t in enumerate(toks)]
    b = tr.new_batch(seqs)
    assert b.static_adv.abs().max() == 0.0
    kl0 = _exact_kl(tr)
    assert kl0 > 0.02  # the starting policy is away from the reference
    lp_old = tr.passes(seqs, list(range(len(seqs))), "policy")
    in_loss0, in_reward0 = _kl_terms(tr, b, seqs, estimator, lp_old)
    assert in_reward0 == pytest.approx(0.0, abs=1e-5)  # rho = 1 and the penalties are centred
    tr.step(b, list(range(len(seqs))))
    in_loss1, in_reward1 = _kl_terms(tr, b, seqs, estimator, lp_old)
    if placement in ("loss", "both"):
        assert in_loss1 < in_loss0, (estimator, placement, in_loss0, in_loss1)
    if placement in ("reward", "both"):
        assert in_reward1 < in_reward0, (estimator, placement, in_reward0, in_reward1)
    if (estimator, placement) in DESCENDS_EXACT_KL:
        kl1 = _exact_kl(tr)
        assert kl1 < kl0, (estimator, placement, kl0, kl1)


# ---- importance weighting ------------------------------------------------------------------------

@pytest.mark.parametrize("kl", [{"beta": 0.0}, {"estimator": "k3", "placement": "loss", "beta": 0.5,
                                                "importance_weighted": True}])
def test_importance_weights_change_the_update_only_when_behaviour_differs(tiny_model_dir, kl):
    comps = [[301, 302, 303], [410, 411, 412, 413], [520, 521], [630, 631, 632]]

    def update(behaviour_shift):
        tr = Trainer(_cfg(tiny_model_dir, old_logprobs="sampler", clip_low=10.0, clip_high=10.0, kl=kl),
                     tiny_model_dir, log=_quiet)
        seqs = [_seq(i, PROMPT, c, float(i % 2)) for i, c in enumerate(comps)]
        cur = tr.passes(seqs, list(range(4)), "policy")  # the behaviour policy = the current one ...
        seqs = [_seq(i, PROMPT, c, float(i % 2), (cur[i][len(PROMPT) - 1:] + behaviour_shift * (i + 1)).tolist())
                for i, c in enumerate(comps)]  # ... or shifted away from it by a known amount
        tr.step(tr.new_batch(seqs), list(range(4)))
        return torch.cat([p.detach().flatten() for p in tr.params])

    same, again = update(0.0), update(0.0)
    assert torch.equal(same, again)
    recompute = Trainer(_cfg(tiny_model_dir, clip_low=10.0, clip_high=10.0, kl=kl), tiny_model_dir, log=_quiet)
    seqs = [_seq(i, PROMPT, c, float(i % 2)) for i, c in enumerate(comps)]
    recompute.step(recompute.new_batch(seqs), list(range(4)))
    on_policy = torch.cat([p.detach().flatten() for p in recompute.params])
    assert torch.allclose(same, on_policy, atol=1e-6)  # behaviour = current: weights are 1, nothing changes
    shifted = update(0.3)
    assert (shifted - same).abs().max() > 1e-4  # behaviour != current: the weights change the update


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("gspo", "seq_mean_token_mean")])
def test_truncated_is_weights_the_update_by_the_known_sampler_mismatch(tiny_model_dir, algorithm, agg):
    """TIS (``train.tis_cap``) with the trainer's recomputed old log-probs: the sampler's log-probs
    are the current policy's shifted by a known amount per sequence, so the weights
    min(exp(old - sampler), cap) are known. No mismatch: the update is the one without TIS. A
    mismatch: the update changes; without TIS the sampler's log-probs never enter the loss."""
    comps = [[301, 302, 303], [410, 411, 412, 413], [520, 521], [630, 631, 632]]

    def update(behaviour_shift, cap):
        tr = Trainer(_cfg(tiny_model_dir, algorithm=algorithm, agg=agg, clip_low=10.0, clip_high=10.0, tis_cap=cap),
                     tiny_model_dir, log=_quiet)
        seqs = [_seq(i, PROMPT, c, float(i % 2)) for i, c in enumerate(comps)]
        cur = tr.passes(seqs, list(range(4)), "policy")
        seqs = [_seq(i, PROMPT, c, float(i % 2), (cur[i][len(PROMPT) - 1:] + behaviour_shift * (i + 1)).tolist())
                for i, c in enumerate(comps)]
        tr.step(tr.new_batch(seqs), list(range(4)))
        return torch.cat([p.detach().flatten() for p in tr.params])

    plain = update(0.0, None)
    assert torch.equal(update(-0.4, None), plain)  # without TIS the sampler's log-probs are not used
    assert torch.allclose(update(0.0, 2.0), plain, atol=1e-6)  # no mismatch: every weight is 1
    shifted = update(-0.4, 2.0)  # weights exp(0.4 (i + 1)) capped at 2: 1.49, 2, 2, 2
    assert (shifted - plain).abs().max() > 1e-4
    # a cap of 1 truncates every weight above 1 back to 1: the update is the plain one again
    assert torch.allclose(update(-0.4, 1.0), plain, atol=1e-6)


def test_importance_weighted_kl_alone_scales_by_the_known_behaviour_ratio(tiny_model_dir, away_from_reference):
    """KL alone (advantage 0, k3 in the loss, a starting policy away from the reference), one
    sequence of n = 3 tokens whose behaviour log-probs are the current policy's + s per token: with
    ``importance_weighted`` its KL is weighted by rho = pi_theta / pi_behaviour = exp(-s n) at the
    current weights, so the whole gradient is exp(-s n) times the one at s = 0 (P5's rho * k3).
    Without importance weighting the behaviour never enters the KL: the gradient does not move."""
    comp = [301, 302, 303]

    def grad(shift, weighted):
        cfg = _cfg(tiny_model_dir, init_adapter=str(away_from_reference), reference="base", max_grad_norm=1e9,
                   old_logprobs="sampler", kl={"estimator": "k3", "placement": "loss", "beta": 1.0,
                                               "importance_weighted": weighted})
        # float32 weights: the step's forward pass gives the same log-probs as this one to rounding
        cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"autocast_dtype": "float32"})})
        tr = Trainer(cfg, tiny_model_dir, log=_quiet)
        cur = tr.passes([_seq(0, PROMPT, comp, 0.5)], [0], "policy")[0]
        seq = _seq(0, PROMPT, comp, 0.5, (cur[len(PROMPT) - 1:] + shift).tolist())
        b = tr.new_batch([seq])
        assert b.static_adv.abs().max() == 0.0
        tr.step(b, [0])
        return torch.cat([p.grad.detach().flatten() for p in tr.params])

    plain, weighted = grad(0.0, False), grad(0.0, True)
    assert plain.abs().max() > 1e-6  # the KL term alone has a gradient here
    assert torch.equal(grad(0.3, False), plain)
    # rho = 1 here, but its score-function part k3 * grad log pi is in the weighted gradient
    assert (weighted - plain).abs().max() > 1e-4 * plain.abs().max()
    shifted, want = grad(0.3, True), math.exp(-0.3 * len(comp)) * weighted
    big = want.abs() > 1e-3 * want.abs().max()  # the entries above float32 rounding noise
    assert float(((shifted - want).abs() / want.abs())[big].max()) < 1e-3
