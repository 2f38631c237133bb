"""The weight-sync canary (:class:`tasks.train.online.EngineSampler`) without vLLM: an in-process
transformers engine with the vLLM engine's interface (``load_weights`` of a merged state,
``score`` of token ids), float32 on both sides, on the tiny model.

Good syncs agree to ~1e-6 nats here (eval mode, with ``lora.dropout`` too); broken ones (a load
that does nothing, the frozen base weights sent instead of the merged ones, a load of layer 0
only) stop the run at its first sync with one line naming how far each side's probe moved.
"""

from __future__ import annotations

import re

import pytest
import torch

from tasks.config import RunConfig
from tasks.train.loops import SampledBatch, train_online
from tasks.train.online import EngineSampler, SyncError, probe_sequence, sync_tolerance
from tasks.train.sequences import TrainSequence


class HFEngine:
    """A transformers model (eval mode; float32, or ``dtype``) behind the ``vllm`` engine's sync
    interface: merged weights (``load_weights``) or the adapter's factors beside the base weights,
    by the vLLM worker's own :class:`tasks.rollout.engines.lora_delta.LoraDelta` (``load_adapter``)."""

    def __init__(self, model_dir, dtype="float32"):
        from tasks.rollout.models import load_model_and_tokenizer

        self.model, _ = load_model_and_tokenizer(model_dir, "cpu", dtype=dtype)
        self.model.eval()
        self.base = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.delta = None
        self.loads = []  # (names, scale) of every load_adapter call

    def load_adapter(self, tensors, scale):
        """Serve the LoRA factors ``tensors`` at ``scale`` beside the base weights."""
        from tasks.rollout.engines.lora_delta import LoraDelta

        if self.delta is None:
            self.delta = LoraDelta(self.model)
        info = self.delta.load(tensors, scale)
        self.loads.append((sorted(tensors), scale))
        return {"seconds": 0.0, "names": len(tensors),
                "bytes": sum(v.numel() * v.element_size() for v in tensors.values()), **info}

    def load_weights(self, state):
        """Copy ``state`` (checkpoint names, e.g. ``Trainer.merged_state``) into the weights."""
        sd = self.model.state_dict()
        unknown = sorted(set(state) - set(sd))
        if unknown:
            raise KeyError(f"load_weights: no weights named {unknown[:3]}")
        with torch.no_grad():
            for k, v in state.items():
                sd[k].copy_(v)
        return {"seconds": 0.0, "names": len(state), "bytes": sum(v.numel() * v.element_size() for v in state.values())}

    def score(self, prompts):
        """Log-probs of every token after the first of each prompt (as ``VLLMPolicy.score``)."""
        out = []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p])
                lp = torch.log_softmax(self.model(ids).logits.float(), -1)[0, :-1]
                out.append(lp.gather(-1, ids[0, 1:, None])[:, 0].tolist())
        return out


def _cfg(model_dir, **train):
    t = {"mode": "online", "steps": 3, "lr": 0.05, "micro_batch_size": 8, "kl": {"beta": 0.0},
         "lora": {"r": 4, "alpha": 8, "dropout": 0.1}, **train}
    return RunConfig.model_validate({"name": "c", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "train": t,
                                     "policy": {"model": str(model_dir), "rollout_dtype": "float32",
                                                "autocast_dtype": "float32"}})


def _batch(version):
    """Two groups of three sequences (rewards 0 1 0 | 1 0 1), as sampled by policy ``version``."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(6):
        prompt = torch.randint(5, 500, (5,), generator=g).tolist()
        comp = torch.randint(5, 500, (4,), generator=g).tolist()
        seqs.append(TrainSequence(f"e{i}", prompt + comp, [0] * 5 + [1] * 4, [0.0] * 5 + [-6.0] * 4, float(i % 2),
                                  f"t{i // 3}", f"h{i // 3}", "H", (1.0, 0, 1.0), policy_version=version))
    return SampledBatch(seqs=seqs, dropped={}, rows={})


def _run(cfg, model_dir, engine, out_dir, adapter_only=False):
    """Train online through ``engine`` with the canary at its default tolerance; returns the
    result, the sync reports, the iterations sampled and the trainer."""
    sampled, reports, held = [], [], []

    def sample(_engine, iteration, version):
        sampled.append(iteration)
        return _batch(version)

    sampler = EngineSampler(engine, sample, dtype="float32", tolerance=sync_tolerance(cfg), log=lambda m: None,
                            adapter_only=adapter_only)
    sync = sampler.sync

    def recorded(trainer):
        held.append(trainer)
        reports.append(sync(trainer))
        return reports[-1]

    sampler.sync = recorded
    try:
        result, _ = train_online(cfg, model_dir, sampler, out_dir, log=lambda m: None)
    finally:
        sampler.close()
    return result, reports, sampled, held


def test_tolerance_follows_the_precision():
    def cfg(rollout, autocast, **train):
        return RunConfig.model_validate({"name": "c", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                         "harnesses": ["direct"], "train": train,
                                         "policy": {"rollout_dtype": rollout, "autocast_dtype": autocast}})

    assert sync_tolerance(cfg("float32", "float32")) == 1e-3
    assert sync_tolerance(cfg("bfloat16", "float32")) == sync_tolerance(cfg("float32", "bfloat16")) == 0.5
    assert sync_tolerance(cfg("bfloat16", "bfloat16")) == 0.5
    assert sync_tolerance(cfg("float32", "float32", sync_tolerance=0.01)) == 0.01


def test_good_syncs_agree_in_eval_mode_with_dropout(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir)
    engine = HFEngine(tiny_model_dir)
    result, reports, sampled, (tr, *_) = _run(cfg, tiny_model_dir, engine, tmp_path / "a")
    assert sampled == [0, 1, 2] and len(result.steps) == 3 and len(reports) == 2  # no sync after the last
    for rep in reports:
        assert rep["max_abs_logp_diff"] < 1e-5, rep  # float32, eval mode: rounding only
        assert rep["moved_trainer"] > 1e-2 and abs(rep["moved_engine"] - rep["moved_trainer"]) < 1e-5, rep
    assert [p["sync_max_abs_logp_diff"] for p in result.phases][:2] == [r["max_abs_logp_diff"] for r in reports]
    # the engine now holds the last synced policy (version 2); scored in train mode (dropout on)
    # the trainer's probe would be far from it: why the canary scores in eval mode
    probe = probe_sequence(tr.tokenizer)
    pos = [p for p, m in enumerate(probe.mask[1:]) if m]
    got = engine.score([probe.ids])[0]
    tr.model.train()
    train_mode = tr.passes([probe], [0], "policy")[0]
    assert tr.model.training
    assert max(abs(got[p] - float(train_mode[p])) for p in pos) > 1e-4


BROKEN = {
    "no-op load": lambda eng, state: {"seconds": 0.0, "names": len(state), "bytes": 0},  # ART#661's shape
    "base weights sent": lambda eng, state: HFEngine.load_weights(eng, {k: eng.base[k] for k in state}),  # verl#7495
    "layer 0 only": lambda eng, state: HFEngine.load_weights(eng, {k: v for k, v in state.items()
                                                                   if ".layers.0." in k}),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_sync_that_does_not_reach_the_engine_stops_the_run_at_the_first_sync(tiny_model_dir, tmp_path, broken):
    cfg = _cfg(tiny_model_dir)
    engine = HFEngine(tiny_model_dir)
    engine.load_weights = lambda state: BROKEN[broken](engine, state)
    with pytest.raises(SyncError) as e:
        _run(cfg, tiny_model_dir, engine, tmp_path / "a")
    msg = str(e.value)
    m = re.fullmatch(r"weight sync to policy version 1: the engine's probe log-probs moved by up to (\S+) nats "
                     r"since the last sync, the trainer's by up to (\S+) \(apart by up to (\S+) > "
                     r"train\.sync_tolerance=0\.001\); the weights did not reach the sampler, so its samples are "
                     r"not from the policy being trained", msg)
    assert m is not None, msg
    moved_engine, moved_trainer, apart = (float(x) for x in m.groups())
    assert moved_trainer > 1e-2 and apart > 1e-2
    assert moved_trainer < 0.5  # the old default tolerance, 0.5 nats whatever the dtype, let it pass
    if broken != "layer 0 only":
        assert moved_engine == 0.0  # the engine still holds the base model
    assert not (tmp_path / "a").exists()  # stopped before any adapter was saved


# ---- adapter-only syncs (policy.vllm.lora: delta): bf16 base weights, the factors in float32 ------


def _bf16_cfg(model_dir, **train):
    """bf16 on both sides; the tolerance set for the tiny model, whose random output head moves
    its log-probs by tenths of a nat at most (SmolLM2's default in bf16 is 0.5)."""
    cfg = _cfg(model_dir, sync_tolerance=0.02, **train)
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"rollout_dtype": "bfloat16",
                                                                          "autocast_dtype": "bfloat16"})})


def test_adapter_only_syncs_agree_in_bf16_and_send_only_the_factors(tiny_model_dir, tmp_path):
    cfg = _bf16_cfg(tiny_model_dir)
    assert sync_tolerance(cfg) == 0.02
    engine = HFEngine(tiny_model_dir, dtype="bfloat16")
    result, reports, sampled, (tr, *_) = _run(cfg, tiny_model_dir, engine, tmp_path / "a", adapter_only=True)
    assert sampled == [0, 1, 2] and len(reports) == 2
    # the first sync loads the probe adapter, then the policy; the second only the policy
    assert len(engine.loads) == 3 and {s for _, s in engine.loads} == {tr.adapter_scale()} == {2.0}
    n_factors = sum(1 for k, _ in tr.model.named_parameters() if ".lora_" in k)
    assert all(len(names) == n_factors for names, _ in engine.loads)
    lora_bytes = 4 * sum(p.numel() for k, p in tr.model.named_parameters() if ".lora_" in k)
    merged_bytes = 4 * sum(v.numel() for v in tr.merged_state("float32").values())
    for rep in reports:
        assert rep["sync_bytes"] == lora_bytes < merged_bytes / 2
        assert rep["max_abs_logp_diff"] < 0.02, rep  # bf16 rounding only
    # the engine's base weights are bf16, the factors it applies float32
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {t.a.dtype for t in engine.delta.targets.values()} == {torch.float32}


def _first_layer_only(eng, tensors, scale):
    return HFEngine.load_adapter(eng, {k: v for k, v in tensors.items() if ".layers.0." in k}, scale)


BROKEN_ADAPTER = {
    "no-op load": lambda eng, tensors, scale: {"seconds": 0.0, "names": len(tensors), "bytes": 0},
    "layer 0 only": _first_layer_only,
    "wrong scale (alpha, not alpha / r)": lambda eng, tensors, scale: HFEngine.load_adapter(eng, tensors, scale * 4),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_ADAPTER))
def test_a_broken_adapter_load_stops_the_run_at_the_first_sync_in_bf16(tiny_model_dir, tmp_path, broken):
    cfg = _bf16_cfg(tiny_model_dir)
    engine = HFEngine(tiny_model_dir, dtype="bfloat16")
    engine.load_adapter = lambda tensors, scale: BROKEN_ADAPTER[broken](engine, tensors, scale)
    with pytest.raises(SyncError) as e:
        _run(cfg, tiny_model_dir, engine, tmp_path / "a", adapter_only=True)
    m = re.fullmatch(r"weight sync canary: under the probe adapter \(moving the trainer's probe by (\S+) nats on "
                     r"average\) the engine's log-probs differ from the trainer's by (\S+) nats on average \(> 0\.5 x "
                     r"train\.sync_tolerance=0\.01\); the engine does not apply the adapter it is sent \(missing "
                     r"layers, another scale, or not at all\)", str(e.value))
    assert m is not None, str(e.value)
    moved, apart = float(m[1]), float(m[2])
    assert moved >= 4 * 0.02 and apart > 0.01
    assert not (tmp_path / "a").exists()  # stopped before any adapter was saved


def test_the_probe_adapter_is_fixed_and_leaves_the_trainer_as_it_was(tiny_model_dir):
    from tasks.train.online import probe_adapter
    from tasks.train.trainer import Trainer

    tr = Trainer(_cfg(tiny_model_dir), tiny_model_dir)
    state = tr.adapter_state()
    rng = torch.get_rng_state()
    a, b = probe_adapter(state), probe_adapter(state)
    assert torch.equal(torch.get_rng_state(), rng)  # its own generator
    assert sorted(a) == sorted(state) and all(torch.equal(a[k], b[k]) and a[k].shape == state[k].shape for k in a)
    probe = probe_sequence(tr.tokenizer)
    before = tr.eval_logprobs([probe])[0]
    with tr.adapter_swapped(a):
        under = tr.eval_logprobs([probe])[0]
    after = tr.eval_logprobs([probe])[0]
    assert torch.equal(before, after) and (under - before).abs().max() > 0.05
    assert all(torch.equal(v, state[k]) for k, v in tr.adapter_state().items())
