"""tasks/rollout/decode_attention.py: a decode step's attention equals SDPA's (grouped-query heads,
bool / additive / no masks, left padding), other calls are SDPA's own, and a model switched to it
generates what SDPA generates."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from tasks.rollout.decode_attention import NAME, decode_attention_forward, use_decode_attention


def _case(dtype=torch.float32, b=3, h=6, kv=2, length=7, d=8, q=1):
    g = torch.Generator().manual_seed(0)
    query = torch.randn(b, h, q, d, generator=g).to(dtype)
    key = torch.randn(b, kv, length, d, generator=g).to(dtype)
    value = torch.randn(b, kv, length, d, generator=g).to(dtype)
    keep = torch.ones(b, 1, q, length, dtype=torch.bool)
    keep[0, :, :, :3] = False  # left padding of the first sequence
    return query, key, value, keep


def _reference(query, key, value, keep):
    rep = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query.double(), key.double().repeat_interleave(rep, 1),
                                         value.double().repeat_interleave(rep, 1), attn_mask=keep)
    return out.transpose(1, 2)


MODULE = types.SimpleNamespace(training=False, num_key_value_groups=3, is_causal=True)


@pytest.mark.parametrize("mask", ["bool", "additive", "none"])
def test_a_decode_step_equals_sdpa(mask):
    query, key, value, keep = _case()
    m = {"bool": keep, "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf")), "none": None}[mask]
    out, weights = decode_attention_forward(MODULE, query, key, value, m)
    want = _reference(query, key, value, keep if mask != "none" else torch.ones_like(keep))
    assert weights is None and out.shape == (3, 1, 6, 8)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    if mask != "none":  # the padded keys count: without the mask the first row differs
        free = _reference(query, key, value, torch.ones_like(keep))
        assert (free[0] - out[0].double()).abs().max() > 1e-2


def test_prefill_goes_to_sdpa_unchanged():
    query, key, value, keep = _case(q=4)
    keep = keep & torch.ones(4, 7, dtype=torch.bool).tril(diagonal=3)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = decode_attention_forward(MODULE, query, key, value, keep)
    want, _ = sdpa_attention_forward(MODULE, query, key, value, keep)
    assert torch.equal(out, want)


def test_a_model_switched_to_it_generates_what_sdpa_generates(tiny_model_dir):
    from tasks.rollout.models import load_model_and_tokenizer

    model, _tok = load_model_and_tokenizer(tiny_model_dir, "cpu", "float32")
    ids = torch.randint(3, 1000, (4, 12), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    attn[:2, :4] = 0  # left padding
    kw = dict(input_ids=ids, attention_mask=attn, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        want = model.generate(**kw, output_logits=True, return_dict_in_generate=True)
        use_decode_attention(model)
        assert model.config._attn_implementation == NAME
        got = model.generate(**kw, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), atol=1e-4, rtol=1e-4)
