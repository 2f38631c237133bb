"""The trainer on the tiny model: resume after a kill, starting adapters and the reference,
micro-batch invariance, GSPO variants, and the masks."""

from pathlib import Path

import pytest
import torch

from tasks.config import RunConfig
from tasks.hashing import sha256_dir
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import TrainingInterrupted, _pad, train


def _cfg(model_dir, **train_over):
    t = {"steps": 3, "lr": 0.05, "micro_batch_size": 3, "lora": {"r": 4, "alpha": 8}}
    t.update(train_over)
    return RunConfig.model_validate({"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "policy": {"model": str(model_dir)}, "train": t})


def _seqs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(5, 500, (4 + i % 3,), generator=g).tolist()
        comp = torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
        ids = prompt + comp
        out.append(TrainSequence(
            episode_id=f"e{i}", ids=ids, mask=[0] * len(prompt) + [1] * len(comp),
            behaviour_logp=[0.0] * len(prompt) + [-2.0] * len(comp), reward=float(i % 2),
            task_id=f"t{i // 3}", task_hash=f"h{i // 3}", harness_id="H", sampling_key=(1.0, 0, 1.0)))
    return out


def test_resume_after_a_kill_ends_exactly_where_an_uninterrupted_run_ends(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir)
    full = train(cfg, tiny_model_dir, _seqs(), tmp_path / "full", log=lambda m: None)
    state = tmp_path / "state.pt"
    with pytest.raises(TrainingInterrupted):
        train(cfg, tiny_model_dir, _seqs(), tmp_path / "a", log=lambda m: None, state_path=state, resume_key="k",
              stop_after=2)
    logs = []
    resumed = train(cfg, tiny_model_dir, _seqs(), tmp_path / "b", log=logs.append, state_path=state, resume_key="k")
    assert any("resuming after step 2" in m for m in logs)
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "b") == sha256_dir(tmp_path / "full")
    # a state written under another key is ignored
    other = train(cfg, tiny_model_dir, _seqs(), tmp_path / "c", log=logs.append, state_path=state, resume_key="other")
    assert len(other.steps) == 3 and sha256_dir(tmp_path / "c") == sha256_dir(tmp_path / "full")


def test_starting_adapter_as_reference_has_zero_kl_at_step_one(tiny_model_dir, tmp_path):
    # case 5h: a non-zero starting adapter, kept frozen as the reference: KL exactly 0 at the first step
    first = train(_cfg(tiny_model_dir, steps=2), tiny_model_dir, _seqs(), tmp_path / "start", log=lambda m: None)
    assert first.steps[1]["kl"] != 0.0  # the adapter moved: it is non-zero
    cfg = _cfg(tiny_model_dir, steps=2, init_adapter=str(tmp_path / "start"), kl={"estimator": "k3", "placement": "loss",
                                                                                  "beta": 0.1})
    res = train(cfg, tiny_model_dir, _seqs(), tmp_path / "next", log=lambda m: None)
    assert res.steps[0]["kl"] == 0.0 and res.steps[1]["kl"] > 0.0
    base_ref = _cfg(tiny_model_dir, steps=1, init_adapter=str(tmp_path / "start"), reference="base",
                    kl={"estimator": "k3", "placement": "loss", "beta": 0.1})
    res_b = train(base_ref, tiny_model_dir, _seqs(), tmp_path / "next-b", log=lambda m: None)
    assert res_b.steps[0]["kl"] > 0.0  # reference = base: the starting adapter already differs from it


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("grpo", "seq_mean_token_mean"),
                                           ("grpo", "seq_mean_token_sum_norm"), ("gspo", "seq_mean_token_mean"),
                                           ("gspo_token", "seq_mean_token_mean")])
def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, tmp_path, algorithm, agg):
    kw = dict(steps=1, algorithm=algorithm, agg=agg, kl={"estimator": "k2", "placement": "loss", "beta": 0.2},
              max_len=16 if agg == "seq_mean_token_sum_norm" else None)
    one = train(_cfg(tiny_model_dir, micro_batch_size=6, **kw), tiny_model_dir, _seqs(), tmp_path / "one", log=lambda m: None)
    many = train(_cfg(tiny_model_dir, micro_batch_size=1, **kw), tiny_model_dir, _seqs(), tmp_path / "many",
                 log=lambda m: None)
    assert one.steps[0]["loss"] == pytest.approx(many.steps[0]["loss"], rel=1e-4, abs=1e-6)
    assert one.steps[0]["grad_norm"] == pytest.approx(many.steps[0]["grad_norm"], rel=1e-3)


def test_padding_is_masked_and_pad_equal_to_eos_keeps_the_first_eos():
    # case 5c: padding never enters the loss; with pad id == EOS id the one real EOS is kept
    eos = 7
    s1 = TrainSequence("a", [1, 2, 3, eos], [0, 1, 1, 1], [0, -1, -1, -1], 1.0, "t", "h", "H", (1.0, 0, 1.0))
    s2 = TrainSequence("b", [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1], [0, 0, -1, -1, -1, -1], 0.0, "t", "h", "H",
                       (1.0, 0, 1.0))
    ids, attn, mask, _ = _pad([s1, s2], [0, 1], pad_id=eos)
    assert ids[0].tolist() == [1, 2, 3, eos, eos, eos]
    assert mask[0].tolist() == [1, 1, 1, 0, 0]  # targets: the real EOS (position 3) is trained, pads are not
    assert attn[0].tolist() == [1, 1, 1, 1, 0, 0]
    assert mask[1].tolist() == [0, 1, 1, 1, 1]  # no EOS (truncated): every generated token, nothing more


def test_generation_trims_at_the_first_eos_when_pad_is_eos():
    from tasks.rollout.policy import trim_completion

    toks, lps, finish = trim_completion([5, 6, 2, 2, 2], [-1.0, -2.0, -0.5, -9.0, -9.0], eos_id=2)
    assert (toks, lps, finish) == ([5, 6, 2], [-1.0, -2.0, -0.5], "stop")
    toks, lps, finish = trim_completion([5, 6, 7], [-1.0, -2.0, -3.0], eos_id=2)
    assert (toks, finish) == ([5, 6, 7], "length")


def test_lora_rank_32_trains(tiny_model_dir, tmp_path):
    res = train(_cfg(tiny_model_dir, steps=1, lora={"r": 32, "alpha": 64}), tiny_model_dir, _seqs(), tmp_path / "r32",
                log=lambda m: None)
    import json

    assert json.loads((tmp_path / "r32/adapter_config.json").read_text())["r"] == 32
    assert res.steps[0]["grad_norm"] > 0


def _sampler(calls):
    def sample(trainer, version, iteration):
        calls.append((version, iteration))
        seqs = _seqs(seed=iteration)
        return seqs, {"version": version, "iteration": iteration}

    return sample


@pytest.mark.parametrize("staleness,versions,n_batches", [(0, [0, 1, 2, 3, 4], 5), (1, [0, 0, 2, 2, 4], 3),
                                                           (3, [0, 0, 0, 0, 4], 2)])
def test_online_mode_bounds_staleness_and_logs_it(tiny_model_dir, tmp_path, staleness, versions, n_batches):
    from tasks.train.trainer import train_online

    cfg = _cfg(tiny_model_dir, steps=5, mode="online", max_staleness=staleness)
    calls = []
    res, sampled = train_online(cfg, tiny_model_dir, _sampler(calls), tmp_path / "a", log=lambda m: None)
    assert [r["policy_version_sampled"] for r in res.steps] == versions
    assert [r["staleness"] for r in res.steps] == [s - v for s, v in zip(range(5), versions)]
    assert max(r["staleness"] for r in res.steps) <= staleness
    assert len(calls) == n_batches == len(sampled) and [c[0] for c in calls] == sorted(set(versions))


def test_online_mode_resumes_with_the_next_batch(tiny_model_dir, tmp_path):
    from tasks.train.trainer import train_online

    cfg = _cfg(tiny_model_dir, steps=4, mode="online", max_staleness=1)
    full, _ = train_online(cfg, tiny_model_dir, _sampler([]), tmp_path / "full", log=lambda m: None)
    state = tmp_path / "s.pt"
    calls = []

    def dies_on_second_batch(trainer, version, iteration):
        if iteration == 1:
            raise KeyboardInterrupt("killed")
        return _sampler(calls)(trainer, version, iteration)

    with pytest.raises(KeyboardInterrupt):
        train_online(cfg, tiny_model_dir, dies_on_second_batch, tmp_path / "x", log=lambda m: None,
                     state_path=state, resume_key="k")
    calls.clear()
    resumed, sampled = train_online(cfg, tiny_model_dir, _sampler(calls), tmp_path / "r", log=lambda m: None,
                                    state_path=state, resume_key="k")
    assert calls == [(2, 1)] and len(sampled) == 2
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "r") == sha256_dir(tmp_path / "full")


def test_online_config_rules():
    from pydantic import ValidationError

    base = {"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}], "harnesses": ["direct"]}
    with pytest.raises(ValidationError, match="behaviour"):
        RunConfig.model_validate({**base, "train": {"mode": "online", "old_logprobs": "recompute"}})
    with pytest.raises(ValidationError, match="online. only"):
        RunConfig.model_validate({**base, "train": {"max_staleness": 2}})
    with pytest.raises(ValidationError, match="in-loss"):
        RunConfig.model_validate({**base, "train": {"kl": {"importance_weighted": True, "placement": "reward"}}})


def test_shared_prompt_gives_the_same_logprobs_and_gradients(tiny_model_dir):
    from tasks.train.trainer import Trainer, _logp, _pad, prefix_len

    cfg = _cfg(tiny_model_dir)
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"autocast_dtype": "float32"})})
    tr = Trainer(cfg, tiny_model_dir, log=lambda m: None)  # fp32: the two layouts must agree to rounding
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
    ids, attn, mask, _ = _pad(seqs, idx, tr.pad_id)

    def run(shared):
        tr.model.zero_grad()
        kw = {"prefix_lens": [prefix_len(seqs[i]) for i in idx], "pad_id": tr.pad_id} if shared else {}
        lp, ent = _logp(tr.model, ids, attn, mask, (0.9, 0, 1.0), tr.ac, with_entropy=True, **kw)
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
            "from tasks.train.trainer import train;"
            "train(_cfg(Path(sys.argv[1]), steps=1), Path(sys.argv[1]), _seqs(), Path(sys.argv[2]), log=lambda m: None)")
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"a{seed}"
        subprocess.run([sys.executable, "-c", code, str(tiny_model_dir), str(out)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, cwd=Path(__file__).resolve().parents[2])
        outs.append(out)
    assert (outs[0] / "adapter_config.json").read_bytes() == (outs[1] / "adapter_config.json").read_bytes()
    assert sha256_dir(outs[0]) == sha256_dir(outs[1])
