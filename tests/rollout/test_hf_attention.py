"""``tasks.rollout.hf_attention``: grouped key/value heads go straight to torch's kernel on the CPU,
with the logits, samples and gradients of transformers' own ``sdpa``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import tasks.rollout.hf_attention as hf_attention


def _pair(tiny_model_dir):
    stock = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ours = hf_attention.use_cpu_gqa_attention(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval())
    assert stock.config._attn_implementation == "sdpa" and ours.config._attn_implementation == hf_attention.NAME
    assert stock.config.num_key_value_heads < stock.config.num_attention_heads  # the tiny model groups its heads
    return stock, ours


def _batch():
    ids = torch.tensor([[3, 3, 3, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25, 26], [3, 30, 31, 32, 33, 34, 35]])
    return ids, (ids != 3).long()  # left padding: a mask in every call


@pytest.fixture()
def kernel_calls(monkeypatch):
    """Every torch SDPA call: (query heads, key heads, enable_gqa)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        calls.append((q.shape[1], k.shape[1], kw.get("enable_gqa", False)))
        return real(q, k, v, *args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def test_masked_grouped_attention_takes_the_groups_and_keeps_the_logits(tiny_model_dir, kernel_calls):
    stock, ours = _pair(tiny_model_dir)
    ids, attn = _batch()
    with torch.no_grad():
        want = stock(input_ids=ids, attention_mask=attn).logits
        kernel_calls.clear()
        got = ours(input_ids=ids, attention_mask=attn).logits
    assert kernel_calls and all(c == (4, 2, True) for c in kernel_calls)  # key/value heads not copied
    assert torch.allclose(got, want, atol=1e-5)


def test_generate_samples_the_same_tokens(tiny_model_dir):
    from transformers import GenerationConfig

    stock, ours = _pair(tiny_model_dir)
    ids, attn = _batch()
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16, eos_token_id=2,
                           pad_token_id=3, return_dict_in_generate=True, output_scores=True)
    out = []
    for model in (stock, ours):
        torch.manual_seed(11)
        with torch.inference_mode():
            out.append(model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg))
    assert torch.equal(out[0].sequences, out[1].sequences)
    for a, b in zip(out[0].scores, out[1].scores):
        assert torch.allclose(a, b, atol=1e-5)


def test_gradients_equal_sdpa_s(tiny_model_dir):
    stock, ours = _pair(tiny_model_dir)
    ids, attn = _batch()
    grads = []
    for model in (stock, ours):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=attn).logits
        torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mul(attn[:, 1:, None]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_calls_it_does_not_improve_go_to_transformers_sdpa(monkeypatch):
    seen = []
    monkeypatch.setattr(hf_attention, "sdpa_attention_forward", lambda *a, **kw: seen.append(kw) or ("sdpa", None))
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    assert hf_attention.sdpa_cpu_gqa(None, q, k, k, None)[0] == "sdpa"  # no mask: sdpa takes the groups itself
    assert hf_attention.sdpa_cpu_gqa(None, q, q, q, mask)[0] == "sdpa"  # no grouping
    assert hf_attention.sdpa_cpu_gqa(None, q, k, k, mask, position_bias=torch.zeros(1))[0] == "sdpa"
    bf = q.bfloat16(), k.bfloat16()  # torch's grouped CPU kernel is slower than pack_gqa in bfloat16
    assert hf_attention.sdpa_cpu_gqa(None, bf[0], bf[1], bf[1], mask)[0] == "sdpa"
    assert len(seen) == 4
    out, _ = hf_attention.sdpa_cpu_gqa(None, q, k, k, mask)
    assert out.shape == (1, 3, 4, 8) and len(seen) == 4


def test_the_loader_switches_models_to_it(tiny_model_dir):
    from tasks.rollout.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_model_dir)
    assert model.config._attn_implementation == hf_attention.NAME
