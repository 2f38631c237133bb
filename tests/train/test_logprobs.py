import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tasks.train.logprobs import process_logits, token_logprobs


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.5, 5, None), (0.7, None, 0.8), (1.3, 7, 0.9)])
def test_processing_matches_transformers_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    x = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p:
        x = TopPLogitsWarper(top_p)(None, x)
    ours = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(x))
    assert torch.allclose(ours[~torch.isinf(ours)], x[~torch.isinf(x)])


def test_token_logprobs_shapes_and_values():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))  # [1, 2, 3]
    ids = torch.tensor([[0, 2]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp.exp().tolist()[0] == pytest.approx([0.5, 0.8])
    # top-k 1 renormalises onto the argmax: log-prob 0 for it, -inf for others
    lp1 = token_logprobs(logits, torch.tensor([[0, 0]]), top_k=1)
    assert lp1[0, 0].item() == 0.0 and lp1[0, 1].item() == float("-inf")


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.5, 0, 1.0), (0.8, 20, 1.0), (1.0, 0, 0.9)])
def test_sampler_and_trainer_logprobs_agree(tiny_model_dir, temperature, top_k, top_p):
    # case 5i: same weights (fp32), temperature 0.5: generate's log-probs == recomputation
    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy

    pol = HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=4),
                   base_model_id="tiny")
    prompts = [pol.tokenizer.encode("Calculate 3 + 4."), pol.tokenizer.encode("What is 12 - 5? Answer:")]
    sampling = SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12)
    gens = pol.generate(prompts, sampling, seed=3)
    for p, g in zip(prompts, gens):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = pol.model(input_ids=ids).logits[:, len(p) - 1:-1]
        lp = token_logprobs(logits, ids[:, len(p):], temperature=temperature, top_k=top_k, top_p=top_p)[0]
        assert len(g.logprobs) == len(g.token_ids) > 0
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-5), (lp, g.logprobs)
