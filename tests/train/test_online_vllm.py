"""Online training through the vLLM engine on the tiny model: the trainer's weights reach the
running engine in place, the sync canary catches weights that did not, and the train stage samples
fresh batches through one engine with bounded staleness. Needs .venv-vllm (scripts/setup-vllm.sh).

Tolerances: float32 on both sides (see tests/rollout/test_engines_vllm.py): the engine's and the
trainer's log-probs of the same tokens agree to ~1e-6 nats at the same weights; the updates here
move them by > 0.05.
"""

from __future__ import annotations

import math

import pytest
import torch

from tasks.config import RunConfig
from tasks.train.sequences import TrainSequence
from tests.facilities import require_vllm_venv


def _cfg(model_dir, **train):
    t = {"lr": 0.05, "micro_batch_size": 8, "lora": {"r": 4, "alpha": 8}, "kl": {"beta": 0.0}, "mode": "online",
         "steps": 2, **train}
    return RunConfig.model_validate({
        "name": "ov", "suites": [{"name": "basic_arithmetic", "size": 8, "seed": 3,
                                  "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.25}, "harnesses": ["direct"], "rollout": {"samples_per_task": 2},
        "policy": {"model": str(model_dir), "engine": "vllm", "rollout_dtype": "float32", "autocast_dtype": "float32"},
        "train": t})


def _quiet(_m):
    return None


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    require_vllm_venv()
    from tasks.rollout.engines import load_policy

    pol = load_policy(_cfg(tiny_model_dir))
    yield pol
    pol.close()


def _moved_trainer(model_dir):
    """A trainer whose policy has moved away from the base model by one large step."""
    from tasks.train.trainer import Trainer

    tr = Trainer(_cfg(model_dir, lr=0.5), model_dir, log=_quiet)
    seqs = [TrainSequence(f"s{i}", [5, 6, 7, 8 + i, 9 + i], [0, 0, 0, 1, 1], [0.0] * 5, float(i % 2), "t", "h", "H",
                          (1.0, 0, 1.0)) for i in range(4)]
    tr.step(tr.new_batch(seqs), [0, 1, 2, 3])
    return tr


def test_weights_reach_the_running_engine_and_the_canary_agrees(engine, tiny_model_dir):
    from tasks.train.online import EngineSampler, probe_sequence

    tr = _moved_trainer(tiny_model_dir)
    probe = probe_sequence(tr.tokenizer)
    before = engine.score([probe.ids])[0]
    sampler = EngineSampler(engine, lambda *a: None, dtype="float32", tolerance=1e-3, log=_quiet)
    try:
        report = sampler.sync(tr)
    finally:
        sampler.close()
    after = engine.score([probe.ids])[0]
    want = tr.passes([probe], [0], "policy")[0]
    idx = [p for p, m in enumerate(probe.mask[1:]) if m]
    assert max(abs(after[p] - float(want[p])) for p in idx) < 1e-4  # the engine now samples the trained policy
    assert max(abs(after[p] - before[p]) for p in idx) > 0.05  # ... which differs from the base model
    assert report["max_abs_logp_diff"] < 1e-4 and report["sync_s"] > 0 and sampler.version == tr.version == 1


def test_the_canary_stops_a_run_whose_weights_never_reached_the_engine(engine, tiny_model_dir, monkeypatch):
    from tasks.train.online import EngineSampler, SyncError

    tr = _moved_trainer(tiny_model_dir)
    engine.load_weights(tr.merged_state("float32"))
    tr.step(tr.new_batch([TrainSequence(f"s{i}", [5, 6, 7, 30 + i, 31], [0, 0, 0, 1, 1], [0.0] * 5, float(i % 2), "t",
                                        "h", "H", (1.0, 0, 1.0)) for i in range(4)]), [0, 1, 2, 3])
    # the public failure: the load "succeeds" but the weights never arrive
    monkeypatch.setattr(engine, "load_weights", lambda state: {"seconds": 0.0, "names": len(state)})
    sampler = EngineSampler(engine, lambda *a: None, dtype="float32", tolerance=1e-3, log=_quiet)
    try:
        with pytest.raises(SyncError, match="did not reach the sampler"):
            sampler.sync(tr)
    finally:
        sampler.close()


@pytest.mark.slow
@pytest.mark.parametrize("staleness,versions", [(0, [0, 1, 2]), (1, [0, 0, 1])])
def test_online_stage_samples_through_one_engine_with_bounded_staleness(tiny_model_dir, tmp_path, staleness,
                                                                        versions):
    require_vllm_venv()
    from schemas import ArtifactStore
    from tasks.records.freeze import freeze_tables
    from tasks.train.online import sync_tolerance
    from tasks.train.stage import run_train

    # a KL term in the loss: every sequence gets a forward pass (the random tiny model's rewards are
    # all 0), so the sampler-vs-trainer mismatch is measured at every on-policy step
    cfg = _cfg(tiny_model_dir, steps=3, max_staleness=staleness, prompts_per_step=3,
               kl={"estimator": "k1", "placement": "loss", "beta": 0.1})
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp_path)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    # online training samples its own episodes; the rollout's (one here: an episodes artifact may not
    # be empty) only meet the leakage guard
    rec = next(r for r in records if r["split"] == "train")
    refs["episodes"] = store.write("rollout", "episodes", [{
        "episode_id": "e0", "record_id": rec["record_id"], "task_id": rec["task_id"], "task_hash": rec["task_hash"],
        "harness_id": rec["harness_id"], "harness_name": rec["harness_name"], "split": "train", "policy_id": "p",
        "policy_version": 0, "group_id": "g", "sample_idx": 0, "seed": 0, "reward": 0.0, "success": False,
        "status": "ok", "stop_reason": "submitted", "num_turns": 1, "input_tokens": 3, "output_tokens": 2,
        "final_answer": "", "answer_parsed": False}], contract="episodes")
    refs["turns"] = store.write("rollout", "turns", [], contract="turns")
    out = run_train(store, cfg, refs)
    steps = store.rows(out["train_steps"])
    assert [s["policy_version_sampled"] for s in steps] == versions
    assert max(s["staleness"] for s in steps) == staleness
    # the batches sampled after a sync carry its canary; the first (base weights, never synced) NaN
    syncs = [s["sync_max_abs_logp_diff"] for s in steps]
    for d, v in zip(syncs, versions):
        if v == 0:
            assert math.isnan(d)
        else:
            assert 0 <= d < sync_tolerance(cfg)
    for s in steps:  # float32 on both sides: the engine's and the trainer's log-probs agree closely
        assert (0 <= s["logp_mismatch_mean"] <= s["logp_mismatch_max"] < 0.05) or s["staleness"] > 0, s
    eps = store.rows(out["online_episodes"])
    assert len(eps) == 3 * 3 * 2 and sorted({e["policy_version"] for e in eps}) == sorted(set(versions))
    phases = store.manifest("train", "train_steps")["extra"]["phases"]
    assert [p["iteration"] for p in phases] == [0, 1, 2] and all(p["sample_s"] > 0 for p in phases)
    assert all(torch.isfinite(torch.tensor(p["sync_s"])) for p in phases)


def _bf16_cfg(model_dir, **train):
    cfg = _cfg(model_dir, **train)
    pol = cfg.policy.model_copy(update={"rollout_dtype": "bfloat16", "autocast_dtype": "bfloat16",
                                        "vllm": cfg.policy.vllm.model_copy(update={"lora": "delta"})})
    return cfg.model_copy(update={"policy": pol})


def test_adapter_only_sync_reaches_the_bf16_engine_and_a_no_op_load_is_caught(tiny_model_dir, monkeypatch):
    """bf16 base weights in vLLM, the adapter's factors sent alone (``lora: delta``): a good sync
    agrees with the trainer (bf16 on both sides), sends a fraction of the merged weights' bytes, and
    moves the engine as the trainer moved; a load that reports success and applies nothing fails
    the first sync's probe-adapter check."""
    require_vllm_venv()
    from tasks.rollout.engines import load_policy
    from tasks.train.online import EngineSampler, SyncError, probe_sequence
    from tasks.train.trainer import Trainer

    tol = 0.02  # the tiny model's random output head moves its log-probs by tenths of a nat at most
    seqs = [TrainSequence(f"s{i}", [5, 6, 7, 8 + i, 9 + i], [0, 0, 0, 1, 1], [0.0] * 5, float(i % 2), "t", "h", "H",
                          (1.0, 0, 1.0)) for i in range(4)]
    for broken in (False, True):
        cfg = _bf16_cfg(tiny_model_dir, lr=0.5)
        tr = Trainer(cfg, tiny_model_dir, log=_quiet)
        tr.step(tr.new_batch(seqs), [0, 1, 2, 3])
        engine = load_policy(cfg)
        try:
            probe = probe_sequence(tr.tokenizer)
            before = engine.score([probe.ids])[0]
            if broken:
                monkeypatch.setattr(engine, "load_adapter", lambda t, s: {"seconds": 0.0, "names": len(t), "bytes": 0})
            sampler = EngineSampler(engine, lambda *a: None, dtype="bfloat16", tolerance=tol, adapter_only=True,
                                    log=_quiet)
            try:
                if broken:
                    with pytest.raises(SyncError, match="under the probe adapter"):
                        sampler.sync(tr)
                    continue
                report = sampler.sync(tr)
            finally:
                sampler.close()
            after = engine.score([probe.ids])[0]
            idx = [p for p, m in enumerate(probe.mask[1:]) if m]
            assert report["max_abs_logp_diff"] < tol and max(abs(after[p] - before[p]) for p in idx) > 0.05
            merged = sum(v.numel() * v.element_size() for v in tr.merged_state("bfloat16").values())
            assert report["sync_bytes"] == sum(v.numel() * 4 for v in tr.adapter_state().values()) < merged
        finally:
            engine.close()
