"""``HFPolicy`` computes a prompt shared by several rows of a batch once (``_shared_prompt_cache``):
the samples, their log-probs and the random stream are those of the full prefill."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture()
def policy(tiny_model_dir):
    from tasks.config import PolicyConfig
    from tasks.rollout.engines.hf import HFPolicy

    cfg = PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=16, batch_overhead_tokens=10_000)
    return HFPolicy(tiny_model_dir, cfg, base_model_id="tiny")


def _sample(policy, prompts, share: bool, monkeypatch):
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy

    prefill_rows: list[int] = []
    real = HFPolicy._shared_prompt_cache

    def spy(self, ids, attn, cache=None):
        out = real(self, ids, attn, cache) if share else cache
        prefilled = out is not None and out.get_seq_length() > 0
        prefill_rows.append(len({(tuple(r), tuple(a)) for r, a in zip(ids.tolist(), attn.tolist())})
                            if prefilled else -1)
        return out

    monkeypatch.setattr(HFPolicy, "_shared_prompt_cache", spy)
    gens = policy.generate(prompts, SamplingSpec(temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=10), seed=7)
    return gens, prefill_rows


def test_a_shared_prompt_samples_what_the_full_prefill_samples(policy, monkeypatch):
    tok = policy.tokenizer
    # three prompts of different lengths (left padding differs per row), four samples each, interleaved
    distinct = [tok.encode("Calculate 3 + 4."), tok.encode("What is 12 - 5? Answer:"), tok.encode("9")]
    prompts = [distinct[i % 3] for i in range(12)]
    shared, rows = _sample(policy, prompts, True, monkeypatch)
    assert rows == [3]  # one batch, its prompts computed once each
    full, rows = _sample(policy, prompts, False, monkeypatch)
    assert rows == [-1]
    assert [g.token_ids for g in shared] == [g.token_ids for g in full]
    for a, b in zip(shared, full):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    # the samples of one prompt differ (the rows draw their own tokens, not copies of the first row's)
    assert len({tuple(g.token_ids) for g in shared[0::3]}) > 1


def test_a_prompt_that_starts_with_the_pad_id_is_not_a_shorter_prompt(policy, monkeypatch):
    # [pad] + x and x pad to the same ids; only the mask tells them apart
    x = policy.tokenizer.encode("What is 12 - 5? Answer:")
    prompts = [[policy.pad_id] + x, [policy.pad_id] + x, x, x]
    shared, rows = _sample(policy, prompts, True, monkeypatch)
    assert rows == [2]
    full, _ = _sample(policy, prompts, False, monkeypatch)
    assert [g.token_ids for g in shared] == [g.token_ids for g in full]
    for a, b in zip(shared, full):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_a_model_with_its_own_cache_implementation_keeps_it(policy, monkeypatch):
    from tasks.harnesses.spec import SamplingSpec

    # generate refuses a cache object beside a cache_implementation (ValueError): none is passed
    monkeypatch.setattr(policy.model.generation_config, "cache_implementation", "static")
    gens = policy.generate([[5, 6, 7]] * 2, SamplingSpec(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4), seed=1)
    assert len(gens) == 2 and all(g.token_ids for g in gens)


def test_the_log_probs_of_a_shared_prompt_equal_a_recomputation(policy):
    from tasks.harnesses.spec import SamplingSpec
    from tasks.train.logprobs import token_logprobs

    prompts = [policy.tokenizer.encode("What is 12 - 5? Answer:")] * 3 + [policy.tokenizer.encode("Calculate 3 + 4.")] * 3
    gens = policy.generate(prompts, SamplingSpec(temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=12), seed=3)
    for p, g in zip(prompts, gens):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[:, len(p) - 1:-1]
        lp = token_logprobs(logits, ids[:, len(p):], temperature=0.7)[0]
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-5), (lp, g.logprobs)


def test_rows_without_a_shared_prompt_or_one_column_wide_skip_the_cache(policy):
    assert policy._shared_prompt_cache(torch.tensor([[3, 5], [4, 6]]), torch.ones(2, 2, dtype=torch.long)) is None
    assert policy._shared_prompt_cache(torch.tensor([[5], [5]]), torch.ones(2, 1, dtype=torch.long)) is None
