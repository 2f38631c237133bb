"""The ``hf`` engine runs a LoRA adapter by forward hooks (:mod:`tasks.rollout.engines.hf_lora`):
the same float32 update peft computes, unmerged beside bf16 base weights, in fewer ops."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch


def _adapter(model_dir: Path, out: Path, targets: list[str], seed: int = 1, **extra) -> Path:
    """A rank-8 peft LoRA adapter on ``targets`` with random (non-zero) A and B (a fresh adapter
    has B = 0 and changes nothing), scaled so that it moves the logits visibly."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False, target_modules=targets,
                                            **extra))
    peft.save_pretrained(out)
    return out


ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    return _adapter(tiny_model_dir, tmp_path_factory.mktemp("lora"), ALL)


def _models(model_dir: Path, adapter_dir: Path, dtype: str):
    from peft import PeftModel

    from tasks.rollout.engines.hf_lora import hook_lora
    from tasks.rollout.models import load_model_and_tokenizer

    base, tok = load_model_and_tokenizer(model_dir, "cpu", dtype)
    peft = PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir).eval()
    hooked, hooks = hook_lora(PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir).eval())
    return base, peft, hooked, hooks, tok


def _batch(tok):
    prompts = [tok.encode(t) for t in ("Calculate 3 + 4.", "What is 12 - 5? Think, then answer.", "2 + 2 =")]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def _logits(model, ids, attn, pos):
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()[attn.bool()]


def test_float32_hooks_compute_peft_s_logits(tiny_model_dir, adapter):
    base, peft, hooked, hooks, tok = _models(tiny_model_dir, adapter, "float32")
    assert hooks.layers == 7 * len(base.model.layers)
    assert not any("lora" in n for n, _ in hooked.named_modules())  # peft's layers are gone
    batch = _batch(tok)
    lp, lh, lb = _logits(peft, *batch), _logits(hooked, *batch), _logits(base, *batch)
    assert (lp - lb).abs().max() > 0.05  # the adapter changes the logits ...
    assert torch.equal(lh, lp)  # ... and the hooks change them exactly as peft does
    hooks.remove()
    assert torch.equal(_logits(hooked, *batch), lb)


@pytest.mark.parametrize("alpha", [16, 12])  # scale 2 (folded into B) and 1.5 (applied as peft applies it)
def test_bf16_hooks_add_the_float32_update_as_peft_does(tiny_model_dir, tmp_path, alpha):
    """Beside bf16 base weights: the same logits as peft's float32 update, bit for bit, where a bf16
    merge (what the engine avoids) moves them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=8, lora_alpha=alpha, init_lora_weights=False, target_modules=ALL)
                   ).save_pretrained(tmp_path / "a")
    base, peft, hooked, _, tok = _models(tiny_model_dir, tmp_path / "a", "bfloat16")
    batch = _batch(tok)
    lp, lh, lb = _logits(peft, *batch), _logits(hooked, *batch), _logits(base, *batch)
    assert (lp - lb).abs().mean() > 0.01
    assert torch.equal(lh, lp)
    merged = copy.deepcopy(peft).merge_and_unload()
    assert not torch.equal(_logits(merged, *batch), lp)


def test_an_adapter_the_hooks_do_not_cover_keeps_peft_s_path(tiny_model_dir, tmp_path):
    dora = _adapter(tiny_model_dir, tmp_path / "dora", ["q_proj", "v_proj"], use_dora=True)
    _, peft, hooked, hooks, tok = _models(tiny_model_dir, dora, "float32")
    assert hooks is None and type(hooked).__name__.startswith("Peft")
    batch = _batch(tok)
    assert torch.equal(_logits(hooked, *batch), _logits(peft, *batch))


def test_the_engine_samples_the_adapted_policy_with_the_trainers_logprobs(tiny_model_dir, adapter):
    from peft import PeftModel

    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy
    from tasks.rollout.models import load_model_and_tokenizer
    from tasks.train.logprobs import token_logprobs

    pol = HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=4),
                   base_model_id="tiny", adapter_dir=adapter)
    assert pol.lora_hooks is not None
    base, _ = load_model_and_tokenizer(tiny_model_dir, "cpu", "float32")
    ref = PeftModel.from_pretrained(base, adapter).eval()  # the trainer's view of the same weights
    prompts = [pol.tokenizer.encode("Calculate 3 + 4."), pol.tokenizer.encode("2 + 2 =")]
    sampling = SamplingSpec(temperature=0.7, max_new_tokens=10)
    for p, g in zip(prompts, pol.generate(prompts, sampling, seed=3)):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = ref(input_ids=ids).logits[:, len(p) - 1:-1]
        lp = token_logprobs(logits, ids[:, len(p):], temperature=0.7)[0]
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-5)
