"""The trainer on the tiny model: mini-batches and epochs, old log-probs fixed per epoch, resume
after a kill, starting adapters and the reference, micro-batch invariance, GSPO's clip acting,
online sampling with bounded staleness, and the masks."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from tasks.config import RunConfig
from tasks.hashing import sha256_dir
from tasks.train.forward import pad_batch
from tasks.train.loops import SampledBatch, TrainingInterrupted, frozen_schedule, train, train_online
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import Trainer


def _cfg(model_dir, **train_over):
    t = {"lr": 0.05, "micro_batch_size": 3, "lora": {"r": 4, "alpha": 8}}
    t.update(train_over)
    return RunConfig.model_validate({"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "policy": {"model": str(model_dir)}, "train": t})


def _seqs(n=6, seed=0, group=3, version=0):
    """``n`` sequences in groups of ``group`` (one task each), rewards alternating 0 / 1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(5, 500, (4 + i % 3,), generator=g).tolist()
        comp = torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
        ids = prompt + comp
        out.append(TrainSequence(
            episode_id=f"e{i}", ids=ids, mask=[0] * len(prompt) + [1] * len(comp),
            behaviour_logp=[0.0] * len(prompt) + [-2.0] * len(comp), reward=float(i % 2),
            task_id=f"t{i // group}", task_hash=f"h{i // group}", harness_id="H", sampling_key=(1.0, 0, 1.0),
            policy_version=version))
    return out


def _quiet(_m):
    return None


def _fp32(cfg):
    """The config with autocast off: base weights in float32, so that two layouts of the same
    computation agree to float32 rounding (bf16 rounding differs with the batch shape)."""
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"autocast_dtype": "float32"})})


# ---- mini-batches and epochs ---------------------------------------------------------------------

def test_one_epoch_is_ceil_n_over_b_steps_each_logged_with_epoch_and_batch(tiny_model_dir, tmp_path):
    seqs = _seqs(n=14, group=2)  # 7 groups
    cfg = _cfg(tiny_model_dir, epochs=2, batch_size=3)
    res = train(cfg, tiny_model_dir, seqs, tmp_path / "a", log=_quiet)
    assert len(res.steps) == 2 * 3  # ceil(7 / 3) = 3 per epoch
    assert [(r["epoch"], r["batch_index"]) for r in res.steps] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [r["step"] for r in res.steps] == [1, 2, 3, 4, 5, 6]
    assert [r["sequences"] for r in res.steps][:3] in ([6, 6, 2], [6, 2, 6], [2, 6, 6])  # whole groups of 2
    sched = frozen_schedule(cfg, [[2 * g, 2 * g + 1] for g in range(7)])
    for _e, _p, _b, idx in sched:  # a group is never split across steps
        assert all((i ^ 1) in idx for i in idx)
    # shuffled per epoch from the seed: the two epochs' orders differ, the same seed repeats them
    assert [s[3] for s in sched[:3]] != [s[3] for s in sched[3:]]
    assert sched == frozen_schedule(cfg, [[2 * g, 2 * g + 1] for g in range(7)])
    other = _cfg(tiny_model_dir, epochs=2, batch_size=3).model_copy(update={"seed": 5})
    assert [s[3] for s in frozen_schedule(other, [[2 * g, 2 * g + 1] for g in range(7)])] != [s[3] for s in sched]


def test_ppo_epochs_reuse_the_epochs_old_logprobs(tiny_model_dir, tmp_path):
    res = train(_cfg(tiny_model_dir, ppo_epochs=3), tiny_model_dir, _seqs(), tmp_path / "a", log=_quiet)
    assert [(r["epoch"], r["ppo_epoch"]) for r in res.steps] == [(0, 0), (0, 1), (0, 2)]
    assert res.steps[0]["ratio_min"] == res.steps[0]["ratio_max"] == 1.0  # old = the policy at the epoch's start
    assert res.steps[1]["ratio_max"] > 1.0 and res.steps[2]["ratio_min"] < 1.0  # later passes: off-policy
    fresh = train(_cfg(tiny_model_dir, epochs=3), tiny_model_dir, _seqs(), tmp_path / "b", log=_quiet)
    assert all(r["ratio_min"] == r["ratio_max"] == 1.0 for r in fresh.steps)  # each epoch re-fixes old


def test_an_epoch_whose_first_mini_batch_has_no_signal_trains_the_rest(tiny_model_dir, tmp_path):
    # GRPO groups whose samples all score the same are common (tasks all fail); when the epoch's
    # first mini-batch holds only such groups its step takes no optimizer step but counts a
    # version, so the next mini-batch cannot take its old log-probs from its own step (it once
    # raised "the batch's first mini-batch must be trained first")
    cfg = _cfg(tiny_model_dir, batch_size=1, kl={"beta": 0.0})
    seqs = _seqs(n=9, group=3)
    first = set(frozen_schedule(cfg, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])[0][3])
    seqs = [dataclasses.replace(s, reward=1.0) if i in first else s for i, s in enumerate(seqs)]
    res = train(cfg, tiny_model_dir, seqs, tmp_path / "a", log=_quiet)
    assert len(res.steps) == 3 and res.steps[0]["grad_norm"] == 0.0 and res.steps[0]["sequences"] == 3
    # the second step's old log-probs are the policy's when the batch was fixed (unchanged by the
    # empty step): its ratio is exactly 1
    assert res.steps[1]["ratio_min"] == res.steps[1]["ratio_max"] == 1.0 and res.steps[1]["grad_norm"] > 0
    assert res.steps[2]["ratio_max"] > 1.0  # and the third is off-policy, as in any epoch


def test_first_mini_batch_takes_its_old_logprobs_from_its_own_step(tiny_model_dir):
    # the first mini-batch is trained at the version that fixed the batch: no separate no-grad
    # pass over it, and the old (and, at version 0, reference) log-probs its step records are the
    # ones that pass would have given
    cfg = _cfg(tiny_model_dir, batch_size=1, kl={"estimator": "k3", "placement": "loss", "beta": 0.1})
    tr = Trainer(cfg, tiny_model_dir, log=_quiet)
    seqs = _seqs(n=12, group=3)
    calls, passes = [], tr.passes
    tr.passes = lambda s, idx, which: (calls.append(set(idx)), passes(s, idx, which))[1]
    b = tr.new_batch(seqs)
    first, second = b.layout[0], b.layout[1]
    assert b.deferred == set(first) and b.ref_deferred and calls
    assert not any(c & set(first) for c in calls)
    expect = passes(seqs, first, "policy")
    row, _ = tr.step(b, first)
    assert row["ratio_min"] == row["ratio_max"] == 1.0 and not b.deferred
    for i in first:
        assert torch.equal(b.old[i], expect[i]) and torch.equal(b.ref[i], expect[i])
    assert b.mismatch is not None and row["logp_mismatch_mean"] == b.mismatch["mean"] > 0
    row2, _ = tr.step(b, second)
    assert row2["logp_mismatch_mean"] == row["logp_mismatch_mean"]  # the batch's, at its sampling version
    late = tr.new_batch(seqs)
    tr.step(late, late.layout[1])
    with pytest.raises(RuntimeError, match="first mini-batch must be trained first"):
        tr.step(late, late.layout[0])  # its old log-probs would be the next version's


def test_gspo_clip_acts_from_the_second_mini_batch_of_an_epoch(tiny_model_dir, tmp_path):
    # the P6 shape: GSPO, clip 3e-4 / 4e-4, one epoch of several mini-batches
    seqs = _seqs(n=12, group=3)  # 4 groups
    kw = dict(algorithm="gspo", agg="seq_mean_token_mean", epochs=1, batch_size=1, lr=0.02)
    res = train(_cfg(tiny_model_dir, clip_low=3e-4, clip_high=4e-4, **kw), tiny_model_dir, seqs, tmp_path / "c",
                log=_quiet)
    fracs = [r["clip_frac"] for r in res.steps]
    assert len(fracs) == 4 and fracs[0] == 0.0 and max(fracs[1:]) > 0, fracs
    wide = train(_cfg(tiny_model_dir, clip_low=10.0, clip_high=10.0, **kw), tiny_model_dir, seqs, tmp_path / "w",
                 log=_quiet)
    assert wide.steps[0]["loss"] == res.steps[0]["loss"]  # on-policy: the clip changes nothing
    assert all(r["clip_frac"] == 0.0 for r in wide.steps)
    assert all(a["loss"] != b["loss"] for a, b in zip(res.steps[1:], wide.steps[1:]) if a["clip_frac"] > 0)


def test_resume_after_a_kill_ends_exactly_where_an_uninterrupted_run_ends(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, epochs=2, batch_size=1, kl={"estimator": "k3", "placement": "reward", "beta": 0.1})
    full = train(cfg, tiny_model_dir, _seqs(), tmp_path / "full", log=_quiet)
    assert len(full.steps) == 4
    state = tmp_path / "state.pt"
    with pytest.raises(TrainingInterrupted):  # killed mid-epoch: the epoch's old log-probs must come back
        train(cfg, tiny_model_dir, _seqs(), tmp_path / "a", log=_quiet, state_path=state, resume_key="k", stop_after=3)
    logs = []
    resumed = train(cfg, tiny_model_dir, _seqs(), tmp_path / "b", log=logs.append, state_path=state, resume_key="k")
    assert any("resuming after step 3" in m for m in logs)
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "b") == sha256_dir(tmp_path / "full")
    other = train(cfg, tiny_model_dir, _seqs(), tmp_path / "c", log=logs.append, state_path=state, resume_key="other")
    assert len(other.steps) == 4 and sha256_dir(tmp_path / "c") == sha256_dir(tmp_path / "full")


# ---- the loss's inputs inside the trainer: TIS weights, asymmetric clip -----------------------------

def _with_behaviour(seqs, logps, shift):
    """``seqs`` with the sampler's log-probs set to ``logps[i]`` (the trainer's, ``[len(ids) - 1]``)
    minus ``shift(i)`` on every policy token: pi_x / pi_sampler = exp(shift(i)) there."""
    out = []
    for i, s in enumerate(seqs):
        m = torch.tensor(s.mask[1:], dtype=torch.float32)
        beh = [0.0] + (logps[i] - shift(i) * m).tolist()
        out.append(dataclasses.replace(s, behaviour_logp=beh))
    return out


def _stacked(per_seq, idx, width):
    out = torch.zeros((len(idx), width), dtype=torch.float32)
    for r, i in enumerate(idx):
        out[r, : per_seq[i].numel()] = per_seq[i]
    return out


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("gspo", "seq_mean_token_mean")])
def test_tis_weights_are_old_over_sampler_on_a_later_mini_batch_and_ppo_epoch(tiny_model_dir, algorithm, agg):
    # TIS corrects the sampler/trainer mismatch of the *old* policy: w = min(pi_old / pi_sampler, C).
    # On a batch's first step the current policy is the old one, so only a later step (a second
    # mini-batch, a second PPO epoch over it) tells old from current. The sampler's log-probs are
    # the version-0 policy's minus 0.3 nats per token: every correct weight is exp(0.3) (below the
    # cap), while weights against the current policy would be exp(0.3 + cur - old).
    from tasks.train.losses import policy_loss, truncated_is_weights

    level = {"grpo": "token", "gspo": "sequence"}[algorithm]
    cfg = _fp32(_cfg(tiny_model_dir, algorithm=algorithm, agg=agg, batch_size=1, micro_batch_size=8, tis_cap=2.0,
                     clip_low=10.0, clip_high=10.0, kl={"beta": 0.0}))
    tr = Trainer(cfg, tiny_model_dir, log=_quiet)
    seqs = _seqs(n=6, group=3)  # 2 groups: 2 mini-batches
    seqs = _with_behaviour(seqs, tr.passes(seqs, list(range(6)), "policy"), lambda i: 0.3)
    b = tr.new_batch(seqs)
    first, second = b.layout
    tr.step(b, first)
    for ppo_epoch in (0, 1):  # the second mini-batch, then a second pass over it
        cur = tr.passes(seqs, second, "policy")
        _, _, mask, blogp = pad_batch(seqs, second, tr.pad_id)
        old_lp, cur_lp = _stacked(b.old, second, mask.shape[1]), _stacked(cur, second, mask.shape[1])
        adv = b.static_adv[second]

        def loss_with(weights):
            return float(policy_loss(cur_lp, old_lp, adv, mask, level=level, clip_low=10.0, clip_high=10.0, agg=agg,
                                     weights=weights)[0])

        want = loss_with(truncated_is_weights(old_lp, blogp, mask, 2.0, level))
        wrong = loss_with(truncated_is_weights(cur_lp, blogp, mask, 2.0, level))
        assert abs(want - wrong) > 1e-4, (want, wrong)  # the policy moved: the two weightings differ
        row, _ = tr.step(b, second, ppo_epoch=ppo_epoch)
        assert row["policy_loss"] == pytest.approx(want, rel=1e-5, abs=1e-7), (ppo_epoch, want, wrong)


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("gspo", "seq_mean_token_mean")])
def test_asymmetric_clip_range_clips_below_1_minus_clip_low_and_above_1_plus_clip_high(tiny_model_dir, algorithm,
                                                                                         agg):
    # DAPO clip-higher: the range is [1 - 0.2, 1 + 0.28]. The old log-probs are the sampler's, set
    # so that every token (GSPO: every sequence) of a positive-advantage sample has ratio 1.25, of
    # two negative ones 0.77 and of the third negative one 1.0. In the range [0.8, 1.28] the
    # positive ones are not clipped, the two negative ones at 0.77 are (at 0.8). With the bounds
    # swapped ([0.72, 1.2]) the positive ones would be clipped (at 1.2) and no negative one.
    # (Ratios placed symmetrically would hide a swap in GSPO's loss: a group's advantages sum to 0.)
    cfg = _fp32(_cfg(tiny_model_dir, algorithm=algorithm, agg=agg, micro_batch_size=8, old_logprobs="sampler",
                     clip_low=0.2, clip_high=0.28, kl={"beta": 0.0}))
    tr = Trainer(cfg, tiny_model_dir, log=_quiet)
    seqs = _seqs(n=6, group=3)  # rewards 0 1 0 | 1 0 1; completions of 2 7 5 | 3 8 6 tokens
    adv = tr.new_batch(seqs).static_adv.tolist()
    assert [a > 0 for a in adv] == [False, True, False, True, False, True]
    ratio = [1.25 if a > 0 else 0.77 for a in adv]
    ratio[4] = 1.0
    seqs = _with_behaviour(seqs, tr.passes(seqs, list(range(6)), "policy"), lambda i: math.log(ratio[i]))
    row, _ = tr.step(tr.new_batch(seqs), list(range(6)))
    assert row["ratio_min"] == pytest.approx(0.77, rel=1e-5) and row["ratio_max"] == pytest.approx(1.25, rel=1e-5)
    n = [sum(s.mask[1:]) for s in seqs]
    taken = [max(r, 0.8) for r in ratio]  # the ratio min(rho A, clip(rho) A) takes, per sample
    if algorithm == "grpo":  # token mean over 31 tokens; samples 0 and 2's 2 + 5 tokens are clipped
        want = sum(-a * t * k for a, t, k in zip(adv, taken, n)) / sum(n)
        assert row["clip_frac"] == pytest.approx(7 / 31, rel=1e-6)
    else:  # mean over the 6 sequences; samples 0 and 2 are clipped
        want = sum(-a * t for a, t in zip(adv, taken)) / 6
        assert row["clip_frac"] == pytest.approx(2 / 6, rel=1e-6)
    assert row["policy_loss"] == pytest.approx(want, rel=1e-5), (row["policy_loss"], want)


# ---- KL ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_kl_in_reward_changes_the_advantages_after_one_update_only_with_beta(tiny_model_dir, beta):
    cfg = _cfg(tiny_model_dir, kl={"estimator": "k1", "placement": "reward", "beta": beta})
    tr = Trainer(cfg, tiny_model_dir, log=_quiet)
    seqs = _seqs()
    b = tr.new_batch(seqs)
    idx = list(range(len(seqs)))
    before, pen0 = tr.advantages(b, idx)
    tr.step(b, idx)
    after, pen1 = tr.advantages(b, idx)
    assert torch.equal(before, b.static_adv)  # at version 0 theta = ref: the penalty is exactly 0
    if beta == 0.0:
        assert torch.equal(after, before)
    else:
        assert pen0 == 0.0 and pen1 != 0.0
        assert (after - before).abs().max() > 1e-3


def test_kl_in_reward_penalises_from_the_second_frozen_step(tiny_model_dir, tmp_path):
    res = train(_cfg(tiny_model_dir, epochs=1, batch_size=1, kl={"estimator": "k1", "placement": "reward", "beta": 0.1}),
                tiny_model_dir, _seqs(), tmp_path / "a", log=_quiet)
    assert res.steps[0]["kl_penalty"] == 0.0 and res.steps[1]["kl_penalty"] != 0.0
    off = train(_cfg(tiny_model_dir, epochs=1, batch_size=1, kl={"beta": 0.0}), tiny_model_dir, _seqs(), tmp_path / "b",
                log=_quiet)
    assert all(r["kl_penalty"] != r["kl_penalty"] for r in off.steps)  # NaN: no KL in the reward


def test_starting_adapter_as_reference_has_zero_kl_at_step_one(tiny_model_dir, tmp_path):
    first = train(_cfg(tiny_model_dir, ppo_epochs=2), tiny_model_dir, _seqs(), tmp_path / "start", log=_quiet)
    assert first.steps[1]["grad_norm"] > 0  # the adapter moved: it is non-zero
    kl = {"estimator": "k3", "placement": "loss", "beta": 0.1}
    cfg = _cfg(tiny_model_dir, ppo_epochs=2, init_adapter=str(tmp_path / "start"), kl=kl)
    res = train(cfg, tiny_model_dir, _seqs(), tmp_path / "next", log=_quiet)
    assert res.steps[0]["kl"] == 0.0 and res.steps[1]["kl"] > 0.0
    base_ref = _cfg(tiny_model_dir, init_adapter=str(tmp_path / "start"), reference="base", kl=kl)
    res_b = train(base_ref, tiny_model_dir, _seqs(), tmp_path / "next-b", log=_quiet)
    assert res_b.steps[0]["kl"] > 0.0  # reference = base: the starting adapter already differs from it


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("grpo", "seq_mean_token_mean"),
                                           ("grpo", "seq_mean_token_sum_norm"), ("gspo", "seq_mean_token_mean"),
                                           ("gspo_token", "seq_mean_token_mean")])
def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, tmp_path, algorithm, agg):
    kw = dict(ppo_epochs=2, algorithm=algorithm, agg=agg, kl={"estimator": "k2", "placement": "loss", "beta": 0.2},
              max_len=16 if agg == "seq_mean_token_sum_norm" else None)
    one = train(_fp32(_cfg(tiny_model_dir, micro_batch_size=6, **kw)), tiny_model_dir, _seqs(), tmp_path / "one",
                log=_quiet)
    many = train(_fp32(_cfg(tiny_model_dir, micro_batch_size=1, **kw)), tiny_model_dir, _seqs(), tmp_path / "many",
                 log=_quiet)
    for a, b in zip(one.steps, many.steps):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, tmp_path):
    kw = dict(ppo_epochs=2, share_prompt=False, kl={"estimator": "k3", "placement": "loss", "beta": 0.1})
    plain = train(_cfg(tiny_model_dir, **kw), tiny_model_dir, _seqs(), tmp_path / "p", log=_quiet)
    ckpt = train(_cfg(tiny_model_dir, gradient_checkpointing=True, **kw), tiny_model_dir, _seqs(), tmp_path / "c",
                 log=_quiet)
    for a, b in zip(plain.steps, ckpt.steps):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_base_weights_are_bf16_and_lora_and_optimizer_state_fp32(tiny_model_dir, tmp_path):
    tr = Trainer(_cfg(tiny_model_dir), tiny_model_dir, log=_quiet)
    frozen = [p for n, p in tr.model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert tr.params and all(p.dtype == torch.float32 for p in tr.params)
    b = tr.new_batch(_seqs())
    tr.step(b, list(range(6)))
    assert all(v.dtype == torch.float32 for st in tr.opt.state.values() for v in st.values() if v.numel() > 1)
    fp32 = Trainer(_fp32(_cfg(tiny_model_dir)), tiny_model_dir, log=_quiet)
    assert all(p.dtype == torch.float32 for p in fp32.model.parameters())


def test_padding_is_masked_and_pad_equal_to_eos_keeps_the_first_eos():
    eos = 7
    s1 = TrainSequence("a", [1, 2, 3, eos], [0, 1, 1, 1], [0, -1, -1, -1], 1.0, "t", "h", "H", (1.0, 0, 1.0))
    s2 = TrainSequence("b", [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1], [0, 0, -1, -1, -1, -1], 0.0, "t", "h", "H",
                       (1.0, 0, 1.0))
    ids, attn, mask, _ = pad_batch([s1, s2], [0, 1], pad_id=eos)
    assert ids[0].tolist() == [1, 2, 3, eos, eos, eos]
    assert mask[0].tolist() == [1, 1, 1, 0, 0]  # targets: the real EOS (position 3) is trained, pads are not
    assert attn[0].tolist() == [1, 1, 1, 1, 0, 0]
    assert mask[1].tolist() == [0, 1, 1, 1, 1]  # no EOS (truncated): every generated token, nothing more


def test_generation_trims_at_the_first_eos_when_pad_is_eos():
    from tasks.rollout.generation import trim_completion

    toks, lps, finish = trim_completion([5, 6, 2, 2, 2], [-1.0, -2.0, -0.5, -9.0, -9.0], eos_id=2)
    assert (toks, lps, finish) == ([5, 6, 2], [-1.0, -2.0, -0.5], "stop")
    toks, lps, finish = trim_completion([5, 6, 7], [-1.0, -2.0, -3.0], eos_id=2)
    assert (toks, finish) == ([5, 6, 7], "length")


def test_lora_rank_32_trains(tiny_model_dir, tmp_path):
    import json

    res = train(_cfg(tiny_model_dir, lora={"r": 32, "alpha": 64}), tiny_model_dir, _seqs(), tmp_path / "r32", log=_quiet)
    assert json.loads((tmp_path / "r32/adapter_config.json").read_text())["r"] == 32
    assert res.steps[0]["grad_norm"] > 0


# ---- online ----------------------------------------------------------------------------------------

def _sampler(calls):
    def sample(trainer, iteration):
        calls.append((trainer.version, iteration))
        return SampledBatch(seqs=_seqs(seed=iteration, version=trainer.version), dropped={},
                            rows={"version": trainer.version, "iteration": iteration})

    return sample


@pytest.mark.parametrize("staleness,versions", [(0, [0, 1, 2, 3, 4]), (1, [0, 0, 1, 2, 3]), (3, [0, 0, 0, 0, 1])])
def test_online_sampler_runs_ahead_by_at_most_max_staleness_with_fresh_batches(tiny_model_dir, tmp_path, staleness,
                                                                               versions):
    cfg = _cfg(tiny_model_dir, mode="online", steps=5, max_staleness=staleness)
    calls = []
    res, sampled = train_online(cfg, tiny_model_dir, _sampler(calls), tmp_path / "a", log=_quiet)
    assert [r["policy_version_sampled"] for r in res.steps] == versions
    assert [r["staleness"] for r in res.steps] == [s - v for s, v in zip(range(5), versions)]
    assert max(r["staleness"] for r in res.steps) <= staleness
    # every iteration is a fresh batch (not one batch reused), sampled once, in order
    assert [c[1] for c in calls] == [0, 1, 2, 3, 4] and [c[0] for c in calls] == versions
    assert [s["iteration"] for s in sampled] == [0, 1, 2, 3, 4]
    assert len(res.phases) == 5


def test_online_ppo_epochs_and_mini_batches(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, mode="online", steps=2, batch_size=1, ppo_epochs=2)
    res, _ = train_online(cfg, tiny_model_dir, _sampler([]), tmp_path / "a", log=_quiet)
    assert [(r["epoch"], r["ppo_epoch"], r["batch_index"]) for r in res.steps] == \
        [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert [r["staleness"] for r in res.steps] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_step_log_lines_name_the_iteration_or_epoch_and_say_kl_off_without_kl(tiny_model_dir, tmp_path):
    lines = []
    cfg = _cfg(tiny_model_dir, mode="online", steps=2, batch_size=1, kl={"beta": 0.0})
    train_online(cfg, tiny_model_dir, _sampler([]), tmp_path / "a", log=lines.append)
    steps = [ln for ln in lines if ln.startswith("train step ")]
    assert [ln.split(":")[0] for ln in steps] == ["train step 1 (iteration 1, batch 0)", "train step 2 (iteration 1, batch 1)",
                                                  "train step 3 (iteration 2, batch 0)", "train step 4 (iteration 2, batch 1)"]
    assert all(" kl off " in ln and "nan" not in ln and "epoch" not in ln for ln in steps)
    # the online loop's own line counts iterations the same way
    assert [ln.split(":")[1].strip() for ln in lines if ln.startswith("train: iteration")] == ["iteration 1/2",
                                                                                               "iteration 2/2"]
    lines.clear()
    train(_cfg(tiny_model_dir, epochs=1, batch_size=1, ppo_epochs=2, kl={"beta": 0.05}), tiny_model_dir, _seqs(n=6),
          tmp_path / "b", log=lines.append)
    steps = [ln for ln in lines if ln.startswith("train step ")]
    assert [ln.split(":")[0] for ln in steps][:3] == ["train step 1 (epoch 0, ppo epoch 0, batch 0)",
                                                      "train step 2 (epoch 0, ppo epoch 0, batch 1)",
                                                      "train step 3 (epoch 0, ppo epoch 1, batch 0)"]
    kls = [float(ln.split(" kl ")[1].split()[0]) for ln in steps]  # a number when KL is on
    assert len(kls) == 4 and all(math.isfinite(k) for k in kls) and kls[0] == 0.0 < max(kls)


def test_online_mode_resumes_with_the_next_batch(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, mode="online", steps=3)
    full, _ = train_online(cfg, tiny_model_dir, _sampler([]), tmp_path / "full", log=_quiet)
    state = tmp_path / "s.pt"
    calls = []

    def dies_on_second_batch(trainer, iteration):
        if iteration == 1:
            raise KeyboardInterrupt("killed")
        return _sampler(calls)(trainer, iteration)

    with pytest.raises(KeyboardInterrupt):
        train_online(cfg, tiny_model_dir, dies_on_second_batch, tmp_path / "x", log=_quiet, state_path=state,
                     resume_key="k")
    calls.clear()
    resumed, sampled = train_online(cfg, tiny_model_dir, _sampler(calls), tmp_path / "r", log=_quiet,
                                    state_path=state, resume_key="k")
    assert calls == [(1, 1), (2, 2)] and len(sampled) == 3
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "r") == sha256_dir(tmp_path / "full")


def test_tasks_per_iteration_without_replacement_within_a_pass():
    from tasks.train.batches import tasks_for_iteration

    tasks = [f"t{i}" for i in range(7)]
    its = [tasks_for_iteration(tasks, 3, i, seed=1) for i in range(7)]
    assert all(len(x) == 3 and len(set(x)) == 3 for x in its)  # never twice in one iteration
    stream = [t for x in its for t in x]
    assert sorted(stream[:7]) == tasks and sorted(stream[7:14]) == tasks  # each pass covers every task once
    assert its == [tasks_for_iteration(tasks, 3, i, seed=1) for i in range(7)]  # seeded
    assert its != [tasks_for_iteration(tasks, 3, i, seed=2) for i in range(7)]
    assert tasks_for_iteration(tasks, None, 4, seed=1) == sorted(tasks)


# ---- config ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("train, message", [
    ({"steps": 3}, "counts sampling iterations of mode 'online'"),
    ({"mode": "online"}, "needs train.steps"),
    ({"mode": "online", "steps": 2, "epochs": 2}, "applies to mode 'frozen' only"),
    ({"prompts_per_step": 4}, "applies to mode 'online' only"),
    ({"max_staleness": 2}, "applies to mode 'online' only"),
    ({"mode": "online", "steps": 2, "old_logprobs": "recompute", "max_staleness": 1}, "nothing would correct"),
    ({"tis_cap": 2.0, "old_logprobs": "sampler"}, "tis_cap=2.0 needs train.old_logprobs='recompute'"),
    ({"mode": "online", "steps": 2, "tis_cap": 2.0}, "needs train.old_logprobs='recompute'"),
    ({"gradient_checkpointing": True}, "cannot be combined with train.share_prompt"),
    ({"kl": {"importance_weighted": True, "placement": "reward"}}, "in-loss"),
    ({"drop_stop_reasons": ["infra_error"]}, "drop_stop_reasons"),
])
def test_config_refuses_what_it_cannot_honour(train, message):
    from pydantic import ValidationError

    base = {"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}], "harnesses": ["direct"]}
    with pytest.raises(ValidationError, match=message):
        RunConfig.model_validate({**base, "train": train})


def test_shared_prompt_gives_the_same_logprobs_and_gradients(tiny_model_dir):
    from tasks.train.forward import prefix_len, sequence_logprobs

    tr = Trainer(_fp32(_cfg(tiny_model_dir)), tiny_model_dir, log=_quiet)  # the two layouts must agree to rounding
    g = torch.Generator().manual_seed(3)
    seqs = []
    for p in range(3):  # 3 prompts of different lengths x 3 samples of different lengths, multi-turn masks
        prompt = torch.randint(5, 500, (5 + 2 * p,), generator=g).tolist()
        for k in range(3):
            comp = torch.randint(5, 500, (3 + 2 * k,), generator=g).tolist()
            obs = torch.randint(5, 500, (2,), generator=g).tolist()
            ids = prompt + comp + obs + comp[:2]
            mask = [0] * len(prompt) + [1] * len(comp) + [0, 0] + [1, 1]
            seqs.append(TrainSequence(f"{p}{k}", ids, mask, [0.0] * len(ids), 0.0, "t", "h", "H", (0.9, 0, 1.0)))
    idx = list(range(len(seqs)))
    ids, attn, mask, _ = pad_batch(seqs, idx, tr.pad_id)

    def run(shared):
        tr.model.zero_grad()
        kw = {"prefix_lens": [prefix_len(seqs[i]) for i in idx], "pad_id": tr.pad_id} if shared else {}
        lp, ent = sequence_logprobs(tr.model, ids, attn, mask, (0.9, 0, 1.0), tr.ac, with_entropy=True, **kw)
        lp.sum().backward()
        return lp.detach(), ent, [p.grad.clone() for p in tr.params]

    lp0, e0, g0 = run(False)
    lp1, e1, g1 = run(True)
    assert (lp0 != 0).sum() == mask.sum()
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g0, g1))


def test_saved_adapter_config_is_byte_stable_across_processes(tiny_model_dir, tmp_path):
    """peft writes target_modules from a set; under different hash seeds the file must not change."""
    import os
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from tests.train.test_trainer import _cfg, _seqs;"
            "from tasks.train.loops import train;"
            "train(_cfg(Path(sys.argv[1])), Path(sys.argv[1]), _seqs(), Path(sys.argv[2]), log=lambda m: None)")
    outs = [tmp_path / f"a{seed}" for seed in ("1", "2")]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tiny_model_dir), str(out)],  # both at once
                              env={**os.environ, "PYTHONHASHSEED": out.name[1:]},
                              cwd=Path(__file__).resolve().parents[2]) for out in outs]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert (outs[0] / "adapter_config.json").read_bytes() == (outs[1] / "adapter_config.json").read_bytes()
    assert sha256_dir(outs[0]) == sha256_dir(outs[1])
