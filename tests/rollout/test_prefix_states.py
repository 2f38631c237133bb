"""``HFPolicy`` carries an episode's keys and values from one turn to the next
(:mod:`tasks.rollout.engines.hf_prefix`): the next turn prefills only what its prompt adds, and
samples what a full prefill samples, with the trainer's log-probs."""

from __future__ import annotations

import shutil

import pytest
import torch

from tasks.harnesses.spec import SamplingSpec

SAMPLING = SamplingSpec(temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=12)


@pytest.fixture()
def policy(tiny_model_dir):
    from tasks.config import PolicyConfig
    from tasks.rollout.engines.hf import HFPolicy

    cfg = PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=16, batch_overhead_tokens=10_000)
    return HFPolicy(tiny_model_dir, cfg, base_model_id="tiny")


def _prefill_widths(policy) -> tuple[list[int], object]:
    """A hook that records how many columns each prefill forward (more than one column, or the
    first call of a batch) runs."""
    widths: list[int] = []
    emb = policy.model.get_input_embeddings()
    return widths, emb.register_forward_hook(lambda m, a, o: widths.append(a[0].shape[1]))


def _turn1(policy, gens0, prompts0):
    """Turn-1 prompts as the harness builds them: prompt + completion (+ EOS if cut) + observation."""
    from tasks.rollout.generation import ChatFormat

    chat = ChatFormat(policy.tokenizer)
    return [p + g.token_ids + chat.continuation(g.token_ids, f"Output: {i * 7}\n(2 turns left)")
            for i, (p, g) in enumerate(zip(prompts0, gens0))]


def test_the_next_turn_prefills_only_what_it_adds_and_samples_what_a_full_prefill_samples(policy):
    from tasks.train.logprobs import token_logprobs

    tok = policy.tokenizer
    # rows 0 and 2 share their prompt: turn 0 prefills it once (_shared_prompt_cache), and each row
    # still keeps a state of its own
    prompts0 = [tok.encode(t) for t in ("Calculate 3 + 4.", "What is 12 - 5? Think, then answer.", "Calculate 3 + 4.",
                                        "2 + 2 =")]
    gens0 = policy.generate(prompts0, SAMPLING, seed=5, keep_states=True)
    assert gens0[0].token_ids != gens0[2].token_ids
    assert all(g.state is not None for g in gens0)
    for p, g in zip(prompts0, gens0):  # a state covers the prompt and the completion tokens fed back
        assert g.state.tokens[:len(p)] == tuple(p) and len(g.state.tokens) <= len(p) + len(g.token_ids)
        assert g.state.kv.shape[3] == len(g.state.tokens)
    prompts1 = _turn1(policy, gens0, prompts0)
    widths, h = _prefill_widths(policy)
    try:
        with_states = policy.generate(prompts1, SAMPLING, seed=9, states=[g.state for g in gens0])
        first_with = widths[0]
        widths.clear()
        full = policy.generate(prompts1, SAMPLING, seed=9)
        first_full = widths[0]
    finally:
        h.remove()
    width = max(map(len, prompts1))
    added = max(len(p1) - len(g.state.tokens) for p1, g in zip(prompts1, gens0))
    assert first_full == width and first_with == added < width
    assert [g.token_ids for g in with_states] == [g.token_ids for g in full]
    for a, b in zip(with_states, full):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    # the log-probs are the trainer's recomputation on the whole sequence
    for p, g in zip(prompts1, with_states):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[:, len(p) - 1:-1]
        lp = token_logprobs(logits, ids[:, len(p):], temperature=SAMPLING.temperature)[0]
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-5)


def test_a_state_that_does_not_start_the_prompt_is_not_used(policy):
    tok = policy.tokenizer
    prompts0 = [tok.encode("Calculate 3 + 4."), tok.encode("2 + 2 =")]
    gens0 = policy.generate(prompts0, SAMPLING, seed=5, keep_states=True)
    prompts1 = _turn1(policy, gens0, prompts0)
    swapped = [gens0[1].state, gens0[0].state]  # each row gets the other episode's state
    widths, h = _prefill_widths(policy)
    try:
        got = policy.generate(prompts1, SAMPLING, seed=9, states=swapped)
    finally:
        h.remove()
    assert widths[0] == max(map(len, prompts1))  # a full prefill
    full = policy.generate(prompts1, SAMPLING, seed=9)
    assert [(g.token_ids, g.logprobs) for g in got] == [(g.token_ids, g.logprobs) for g in full]


def test_no_states_unless_asked_or_over_the_budget(policy, monkeypatch):
    from tasks.rollout.engines import hf_prefix

    prompts = [policy.tokenizer.encode("Calculate 3 + 4.")]
    assert policy.generate(prompts, SAMPLING, seed=1)[0].state is None
    monkeypatch.setattr(hf_prefix, "MAX_STATE_BYTES", 1000)
    assert policy.generate(prompts, SAMPLING, seed=1, keep_states=True)[0].state is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_episodes_with_states_are_the_episodes_without(policy, monkeypatch):
    """Three-turn react-python episodes (the tiny model rarely answers, so most take every turn):
    the same tokens and log-probs whether the harness passes states or not, and it does pass them."""
    from tasks.config import RunConfig, SandboxConfig
    from tasks.harnesses.spec import load_harness
    from tasks.records.freeze import freeze_tables
    from tasks.rollout import harness
    from tasks.rollout.harness import EpisodeJob, run_episodes

    cfg = RunConfig(name="e", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11}], harnesses=["react-python"])
    tasks, _, records = freeze_tables(cfg)
    spec = load_harness("react-python")
    spec = spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"max_new_tokens": 16})})
    jobs = [EpisodeJob(f"ep{i}", records[i % 3], tasks[i % 3], i, i) for i in range(4)]
    calls: list[bool] = []
    real = policy.generate

    def spy(prompts, sampling, seed, *, states=None, keep_states=False):
        calls.append(states is not None and all(s is not None for s in states))
        return real(prompts, sampling, seed, states=states, keep_states=keep_states)

    monkeypatch.setattr(policy, "generate", spy)
    assert harness.takes_states(policy)
    eps_s, turns_s = run_episodes(policy, spec, jobs, SandboxConfig(), seed=3)
    assert calls[0] is False and any(calls[1:])  # turn 0 has no states; later turns have them
    monkeypatch.setattr(harness, "takes_states", lambda p: False)
    eps_f, turns_f = run_episodes(policy, spec, jobs, SandboxConfig(), seed=3)
    assert max(e["num_turns"] for e in eps_s) > 1
    assert [t["completion_token_ids"] for t in turns_s] == [t["completion_token_ids"] for t in turns_f]
    for a, b in zip(turns_s, turns_f):
        assert torch.allclose(torch.tensor(a["completion_logprobs"]), torch.tensor(b["completion_logprobs"]), atol=1e-5)
