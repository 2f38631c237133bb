"""The hf engine's draw (:func:`tasks.rollout.engines.hf.sample_tokens`, an exponential race over
blocks of tokens, then within the winning block, instead of ``torch.multinomial``'s race over every
token): it samples the processed distribution, never a token the warpers excluded, the same tokens
for the same seed, and the log-probs it returns are the trainer's recomputation."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from tasks.rollout.engines.hf import sample_tokens


def _chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square of ``counts`` against ``probs`` (cells with expected count
    < 5 pooled into one)."""
    n = counts.sum().item()
    exp = probs.double() * n
    big = exp >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    ex = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    keep = ex > 0
    stat = ((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum().item()
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def _binned(counts: torch.Tensor, probs: torch.Tensor, bins: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts and probabilities summed over ``bins`` groups of tokens of about equal mass (tokens
    in order of probability), so that every cell expects enough draws."""
    order = torch.argsort(probs, descending=True)
    cum = probs[order].double().cumsum(0)
    group = torch.clamp((cum * bins).ceil().long() - 1, 0, bins - 1)
    return (torch.zeros(bins, dtype=torch.float64).index_add_(0, group, counts[order].double()),
            torch.zeros(bins, dtype=torch.float64).index_add_(0, group, probs[order].double()))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 256])  # 3: a short last block; 7 and 256: one block
def test_draws_follow_the_probabilities_and_never_an_excluded_token(block):
    probs = torch.tensor([0.05, 0.0, 0.30, 0.001, 0.0, 0.149, 0.5])  # zeros: tokens top-k/top-p cut (-inf)
    logp = probs.log().float().expand(100_000, -1).contiguous()
    g = torch.Generator().manual_seed(7)
    tokens = sample_tokens(logp, g, block=block)
    counts = torch.bincount(tokens, minlength=probs.numel())
    assert counts.numel() == probs.numel() and counts[1] == 0 and counts[4] == 0  # probability 0 is never drawn
    assert _chi2_p(counts, probs) > 1e-3, counts.tolist()


def test_a_vocabulary_of_many_blocks_is_sampled_as_a_whole():
    """49,152 tokens (SmolLM2's vocabulary) in 192 blocks: the draws' frequencies over bins of equal
    mass match, and the draws are spread over the blocks as their masses say."""
    v, n = 49_152, 20_000
    logits = torch.randn(v, generator=torch.Generator().manual_seed(2)) * 2.5
    probs = torch.softmax(logits, -1)
    rows, g = torch.log_softmax(logits, -1).expand(500, -1).contiguous(), torch.Generator().manual_seed(5)
    tokens = torch.cat([sample_tokens(rows, g) for _ in range(n // 500)])
    counts = torch.bincount(tokens, minlength=v)
    assert _chi2_p(*_binned(counts, probs)) > 1e-3
    per_block = counts.view(-1, 256).sum(-1)
    assert _chi2_p(per_block, probs.view(-1, 256).sum(-1)) > 1e-3


def test_each_row_draws_from_its_own_distribution():
    # row r puts nearly all its mass on token r: a draw that mixed rows up would show it
    v = 50
    logits = torch.full((v, v), -30.0)
    logits.fill_diagonal_(0.0)
    logp = torch.log_softmax(logits, -1)
    tokens = sample_tokens(logp, torch.Generator().manual_seed(0))
    assert tokens.tolist() == list(range(v))


def test_same_seed_same_tokens_other_seed_other_tokens():
    logp = torch.log_softmax(torch.randn(64, 1000, generator=torch.Generator().manual_seed(1)), -1)
    a = sample_tokens(logp, torch.Generator().manual_seed(3))
    b = sample_tokens(logp, torch.Generator().manual_seed(3))
    c = sample_tokens(logp, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from tasks.config import PolicyConfig
    from tasks.rollout.engines.hf import HFPolicy

    return HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=512),
                    base_model_id="tiny")


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.2, 0, 0.8)])
def test_the_engines_first_tokens_follow_the_processed_distribution(policy, temperature, top_k, top_p):
    """4,096 samples of one prompt's first token against the model's processed probabilities; with
    top-k/top-p, no token outside the kept set."""
    from tasks.harnesses.spec import SamplingSpec
    from tasks.train.logprobs import process_logits

    prompt = policy.tokenizer.encode("Calculate 3 + 4.")
    n = 4096
    gens = policy.generate([prompt] * n, SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p,
                                                      max_new_tokens=1), seed=11)
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(process_logits(logits, temperature=temperature, top_k=top_k or None,
                                         top_p=top_p if top_p < 1 else None), -1)
    first = torch.tensor([g.token_ids[0] for g in gens])
    counts = torch.bincount(first, minlength=probs.numel())
    assert (counts[probs == 0] == 0).all()  # nothing outside top-k / top-p
    assert _chi2_p(*_binned(counts, probs)) > 1e-3
    # the log-prob each row returns is its token's processed log-prob
    lp = torch.tensor([g.logprobs[0] for g in gens])
    assert torch.allclose(lp, probs.log()[first].float(), atol=1e-4)
