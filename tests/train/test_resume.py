"""Exact resume: a run killed after any step and resumed ends with the uninterrupted run's adapter,
byte for byte, in frozen mode and in strictly on-policy online mode (the hf engine sampling), killed
at and away from an epoch (frozen) or batch (online) boundary, with LoRA dropout off and on.

Dropout draws from torch's CPU generator in every training forward and in the no-grad passes that
fix a batch's old log-probs; a resumed frozen run rebuilds its epoch's batch (those passes) before
its next step, so the random streams are put back after the rebuild (``Trainer.restore_rng``)."""

import dataclasses

import pytest
import torch

from tasks.hashing import sha256_dir
from tasks.harnesses.spec import SamplingSpec
from tasks.train.loops import SampledBatch, TrainingInterrupted, train, train_online
from tasks.train.sequences import TrainSequence
from tests.train.test_trainer import _cfg, _quiet, _seqs

DROPOUT = [0.0, 0.1]


def _frozen_cfg(model_dir, dropout):
    # 2 epochs x 3 mini-batches of one group (3 groups of 2): steps 3 / 6 end an epoch
    return _cfg(model_dir, epochs=2, batch_size=1, lora={"r": 4, "alpha": 8, "dropout": dropout})


@pytest.mark.parametrize("dropout", DROPOUT)
@pytest.mark.parametrize("boundary,stop_after", [("mid-epoch", 2), ("epoch end", 3)])
def test_frozen_run_killed_and_resumed_ends_byte_identical(tiny_model_dir, tmp_path, dropout, boundary, stop_after):
    cfg = _frozen_cfg(tiny_model_dir, dropout)
    seqs = _seqs(n=6, group=2)
    full = train(cfg, tiny_model_dir, seqs, tmp_path / "full", log=_quiet)
    assert len(full.steps) == 6
    state = tmp_path / "state.pt"
    with pytest.raises(TrainingInterrupted, match=f"stopped after step {stop_after}"):
        train(cfg, tiny_model_dir, seqs, tmp_path / "cut", log=_quiet, state_path=state, resume_key="k",
              stop_after=stop_after)
    logs: list[str] = []
    resumed = train(cfg, tiny_model_dir, seqs, tmp_path / "resumed", log=logs.append, state_path=state,
                    resume_key="k")
    assert any(f"resuming after step {stop_after}" in m for m in logs)
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "resumed") == sha256_dir(tmp_path / "full")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (dropout then draws from its generator)")
def test_frozen_run_with_dropout_on_cuda_resumes_with_the_cuda_generators(tiny_model_dir, tmp_path):
    cfg = _frozen_cfg(tiny_model_dir, 0.1)
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"device": "cuda"})})
    seqs = _seqs(n=6, group=2)
    full = train(cfg, tiny_model_dir, seqs, tmp_path / "full", log=_quiet)
    state = tmp_path / "state.pt"
    with pytest.raises(TrainingInterrupted):
        train(cfg, tiny_model_dir, seqs, tmp_path / "cut", log=_quiet, state_path=state, resume_key="k", stop_after=2)
    assert torch.load(state, weights_only=False)["rng_streams"]["cuda"] is not None
    resumed = train(cfg, tiny_model_dir, seqs, tmp_path / "resumed", log=_quiet, state_path=state, resume_key="k")
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "resumed") == sha256_dir(tmp_path / "full")


@pytest.mark.parametrize("dropout", DROPOUT)
def test_the_random_streams_decide_the_step_only_with_dropout(tiny_model_dir, dropout):
    # the resume tests compare something the CPU generator decides when dropout is on (and only then):
    # one step from the same weights and batch, with two generator states
    from tasks.train.trainer import Trainer

    cfg = _frozen_cfg(tiny_model_dir, dropout)
    seqs = _seqs(n=6, group=2)
    after = []
    for seed in (1, 2):
        tr = Trainer(cfg, tiny_model_dir, log=_quiet)
        b = tr.new_batch(seqs)
        torch.manual_seed(seed)
        tr.step(b, b.layout[0])
        after.append(torch.cat([p.detach().flatten() for p in tr.params]))
    assert torch.equal(after[0], after[1]) == (dropout == 0.0)


# ---- online: the hf engine samples each batch with the trainer's current weights ---------------------

def _hf_sampler(model_dir, cfg):
    """An online sampler as the train stage's ``policy.engine: hf``: the trainer's adapter merged
    into a float32 copy, 2 prompts x 3 samples generated with it (seeded per iteration); the
    reward of a completion is 1 when it has an even number of tokens (so groups are mixed)."""
    from tasks.rollout.engines.hf import HFPolicy

    prompts = [[5, 17, 33, 60], [7, 91, 120]]
    sampling = SamplingSpec(max_new_tokens=6)

    def sample(trainer, iteration):
        policy = HFPolicy.from_model(trainer.inference_model("float32"), trainer.tokenizer, cfg.policy,
                                     policy_id=f"tiny+v{trainer.version}")
        rows = [p for p in prompts for _ in range(3)]
        gens = policy.generate(rows, sampling, seed=1000 + iteration)
        seqs = []
        for i, (p, g) in enumerate(zip(rows, gens)):
            ids = p + g.token_ids
            seqs.append(TrainSequence(
                episode_id=f"i{iteration}e{i}", ids=ids, mask=[0] * len(p) + [1] * len(g.token_ids),
                behaviour_logp=[0.0] * len(p) + list(g.logprobs), reward=float(len(g.token_ids) % 2 == 0),
                task_id=f"t{i // 3}", task_hash=f"h{i // 3}", harness_id="H", sampling_key=(1.0, 0, 1.0),
                policy_version=trainer.version))
        if len({s.reward for s in seqs}) == 1:  # make sure something trains
            seqs[0] = dataclasses.replace(seqs[0], reward=1.0 - seqs[0].reward)
        return SampledBatch(seqs=seqs, dropped={}, rows={"iteration": iteration, "version": trainer.version,
                                                         "tokens": [g.token_ids for g in gens]})

    return sample


class _Killed(Exception):
    pass


@pytest.mark.parametrize("dropout", DROPOUT)
@pytest.mark.parametrize("boundary", ["batch end", "mid-batch"])
def test_online_on_policy_run_killed_and_resumed_ends_byte_identical(tiny_model_dir, tmp_path, dropout, boundary):
    # strictly on-policy (max_staleness 0), 3 iterations of 2 mini-batches (one group each). The
    # state is saved after every iteration: killed at a batch's end, nothing is lost; killed in the
    # middle of iteration 1 (after its first step), that iteration is sampled again from the
    # weights saved after iteration 0, which are the ones that sampled it the first time
    cfg = _cfg(tiny_model_dir, mode="online", steps=3, batch_size=1, max_staleness=0,
               lora={"r": 4, "alpha": 8, "dropout": dropout})
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"rollout_dtype": "float32"})})
    sampler = _hf_sampler(tiny_model_dir, cfg)
    full, full_sampled = train_online(cfg, tiny_model_dir, sampler, tmp_path / "full", log=_quiet)
    assert len(full.steps) == 6
    state = tmp_path / "state.pt"

    if boundary == "batch end":
        def dying(trainer, iteration):  # killed when iteration 1's batch is asked for
            if iteration == 1:
                raise _Killed()
            return sampler(trainer, iteration)
        kill_version = 2
    else:
        def dying(trainer, iteration):
            return sampler(trainer, iteration)
        kill_version = 3  # iteration 1's first step done, its second not

    stepped = {"n": 0}
    from tasks.train import trainer as trainer_mod

    real_step = trainer_mod.Trainer.step

    def counting_step(self, *a, **kw):
        out = real_step(self, *a, **kw)
        stepped["n"] += 1
        if boundary == "mid-batch" and self.version == kill_version:
            raise _Killed()
        return out

    trainer_mod.Trainer.step = counting_step
    try:
        with pytest.raises(_Killed):
            train_online(cfg, tiny_model_dir, dying, tmp_path / "cut", log=_quiet, state_path=state, resume_key="k")
    finally:
        trainer_mod.Trainer.step = real_step
    assert stepped["n"] == kill_version if boundary == "mid-batch" else stepped["n"] == 2
    assert torch.load(state, weights_only=False)["iteration"] == 0  # the last state: after iteration 0
    resumed, sampled = train_online(cfg, tiny_model_dir, sampler, tmp_path / "resumed", log=_quiet,
                                    state_path=state, resume_key="k")
    assert [s["tokens"] for s in sampled] == [s["tokens"] for s in full_sampled]  # the same samples
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "resumed") == sha256_dir(tmp_path / "full")
