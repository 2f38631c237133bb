"""The HF engine's first generation step must not copy the output projection once per row.

With frozen weights (a peft adapter, a merged copy of the trainer's policy), ``torch.matmul`` runs
the ``[B, 1, H]`` last-position view through a batched product over the weight expanded B times
(see :func:`tasks.rollout.models.contiguous_output_head`); on SmolLM2 with B = 128 that copy was
7 GB. The tests profile one prefill and look for a batched product whose operand is the weight
expanded to the batch.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from tasks.config import PolicyConfig
from tasks.rollout.models import contiguous_output_head, load_model_and_tokenizer
from tasks.rollout.engines.hf import HFPolicy

B = 6


def _expanded_head_products(model, vocab: int) -> list[list[list[int]]]:
    """Input shapes of every ``aten::bmm`` in one last-position prefill whose operand has the
    vocabulary as its last dimension (the output projection run as a batched product)."""
    ids = torch.randint(3, vocab, (B, 9))
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1)
    return [e.input_shapes for e in prof.events()
            if e.name == "aten::bmm" and any(s and s[-1] == vocab for s in e.input_shapes)]


def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_a_frozen_model_without_the_hook_expands_the_head(tiny_model_dir):
    """The control: the behaviour the hook exists for is there in this torch (if this starts to
    fail, torch folded the product itself and the hook is no longer needed)."""
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    head = model.get_output_embeddings()
    head._forward_pre_hooks.clear()  # undo the loader's hook
    head._harnessrl_contiguous_input = False
    vocab = head.weight.shape[0]
    assert _expanded_head_products(_frozen(model), vocab) == [[[B, 1, head.weight.shape[1]], [B, head.weight.shape[1], vocab]]]


def test_the_engines_models_run_the_head_as_one_product(tiny_model_dir):
    cfg = PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=4)
    pol = HFPolicy(tiny_model_dir, cfg, base_model_id="tiny")
    vocab = pol.model.get_output_embeddings().weight.shape[0]
    assert _expanded_head_products(_frozen(pol.model), vocab) == []
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # as a merged copy: no hook yet
    wrapped = HFPolicy.from_model(_frozen(merged), pol.tokenizer, cfg, policy_id="merged")
    assert _expanded_head_products(wrapped.model, vocab) == []
    assert len(contiguous_output_head(wrapped.model).get_output_embeddings()._forward_pre_hooks) == 1  # idempotent
