"""The LoRA delta the vLLM worker applies beside bf16 base weights (``policy.vllm.lora: delta``),
tested on plain torch modules: exact in float32 (against peft), right inside fused layers (vLLM's
``qkv_proj``), replaced in place, refusing what does not fit, and in bf16 keeping a small update
that merging into bf16 weights rounds away."""

from __future__ import annotations

import pytest
import torch

from tasks.rollout.engines.lora_delta import LoraDelta, LoraDeltaError, peft_modules

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft(model_dir, seed=0, b_std=0.02):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                        LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, b_std)
    return pm.eval()


def _state(pm):
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(pm).items()}


def test_float32_delta_equals_peft_and_a_second_load_replaces_it_in_place(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 99, 250, 7, 42, 5]])
    with torch.no_grad():
        plain = base(ids).logits
        delta = LoraDelta(base)
        pm1, pm2 = _peft(tiny_model_dir, seed=1), _peft(tiny_model_dir, seed=2)
        info = delta.load(_state(pm1), 2.0)
        assert info == {"modules": 7 * 2, "layers": 7 * 2, "params": sum(v.numel() for v in _state(pm1).values())}
        assert (base(ids).logits - pm1(ids).logits).abs().max() < 1e-5
        held = {name: (t.a, list(t.bs)) for name, t in delta.targets.items()}
        delta.load(_state(pm2), 2.0)
        assert (base(ids).logits - pm2(ids).logits).abs().max() < 1e-5
        assert (pm1(ids).logits - pm2(ids).logits).abs().max() > 1e-2  # the two adapters differ
        for name, t in delta.targets.items():  # the hooks read the same tensors: updated in place
            assert t.a is held[name][0] and all(x is y for x, y in zip(t.bs, held[name][1]))
        # a wrong scale is a different model (the canary's "wrong scale" catch rests on this)
        delta.load(_state(pm2), 8.0)
        assert (base(ids).logits - pm2(ids).logits).abs().max() > 1e-3
        delta.remove()
        assert torch.equal(base(ids).logits, plain)


class _Fused(torch.nn.Module):
    """vLLM's fused projection in miniature: one matmul, outputs side by side (``output_sizes``),
    returning ``(output, bias)`` as vLLM's linear layers do."""

    def __init__(self, parts: list[torch.nn.Linear]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.cat([p.weight for p in parts]).detach().clone())
        self.output_sizes = [p.out_features for p in parts]

    def forward(self, x):
        return x @ self.weight.T, None


def test_fused_layers_get_each_sub_projection_s_delta_in_its_rows():
    torch.manual_seed(0)
    q, k, v = torch.nn.Linear(16, 16, bias=False), torch.nn.Linear(16, 4, bias=False), torch.nn.Linear(16, 4, bias=False)
    attn = torch.nn.Module()
    attn.qkv_proj = _Fused([q, k, v])
    model = torch.nn.Module()
    model.attn = attn
    factors = {}
    for name, lin in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        factors[f"base_model.model.attn.{name}.lora_A.weight"] = torch.randn(3, 16)
        factors[f"base_model.model.attn.{name}.lora_B.weight"] = torch.randn(lin.out_features, 3)
    delta = LoraDelta(model, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    assert delta.load(factors, 0.5) == {"modules": 3, "layers": 1, "params": 3 * 3 * 16 + 3 * (16 + 4 + 4)}
    x = torch.randn(5, 16)
    with torch.no_grad():
        got, bias = model.attn.qkv_proj(x)
        want = torch.cat([lin(x) + 0.5 * x @ factors[f"base_model.model.attn.{n}.lora_A.weight"].T
                          @ factors[f"base_model.model.attn.{n}.lora_B.weight"].T
                          for n, lin in (("q_proj", q), ("k_proj", k), ("v_proj", v))], dim=-1)
    assert bias is None and (got - want).abs().max() < 1e-5
    # k's factors in v's rows would be wrong: swapping them must change the output
    swapped = dict(factors)
    for ab in "AB":
        swapped[f"base_model.model.attn.k_proj.lora_{ab}.weight"] = factors[f"base_model.model.attn.v_proj.lora_{ab}.weight"]
        swapped[f"base_model.model.attn.v_proj.lora_{ab}.weight"] = factors[f"base_model.model.attn.k_proj.lora_{ab}.weight"]
    delta.load(swapped, 0.5)
    with torch.no_grad():
        assert (model.attn.qkv_proj(x)[0] - want).abs().max() > 1e-2


def test_what_does_not_fit_is_refused_and_changes_nothing(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    state = _state(_peft(tiny_model_dir))
    delta = LoraDelta(base)
    with pytest.raises(LoraDeltaError, match=r"adapter module 'model\.layers\.0\.self_attn\.x_proj': no such layer"):
        delta.load({k.replace("layers.0.self_attn.q_proj", "layers.0.self_attn.x_proj"): v for k, v in state.items()},
                   2.0)
    with pytest.raises(LoraDeltaError, match=r"needs both lora_A and lora_B"):
        delta.load({k: v for k, v in state.items() if not ("layers.0.self_attn.q_proj" in k and "lora_B" in k)}, 2.0)
    with pytest.raises(LoraDeltaError, match=r"not a LoRA factor"):
        delta.load({"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2)}, 2.0)
    assert not delta.targets and not delta.handles  # nothing installed by the failed loads
    delta.load(state, 2.0)
    first = {n: t.a.clone() for n, t in delta.targets.items()}
    with pytest.raises(LoraDeltaError, match=r"names other modules than the first load: missing \['model\.layers\.0"):
        delta.load({k: v * 3 for k, v in state.items() if ".layers.0." not in k}, 2.0)
    with pytest.raises(LoraDeltaError, match=r"B has 3 rows"):
        delta.load({k: (v[:3] if "layers.1.mlp.down_proj.lora_B" in k else v) for k, v in state.items()}, 2.0)
    assert all(torch.equal(t.a, first[n]) for n, t in delta.targets.items())  # the refused loads changed nothing
    assert set(peft_modules(state)) == set(delta.names)


@pytest.mark.parametrize("b_std", [2e-3, 2e-4])
def test_in_bf16_the_delta_is_the_bf16_output_plus_the_rounded_update(b_std):
    """One layer, bf16 base weights (576 x 576, as SmolLM2's), a rank-16 update s B A. The delta
    adds the float32 update, rounded once to bf16, to the layer's bf16 output: what peft computes
    in the trainer under bf16 autocast, so engine and trainer agree. Against the float32 update's
    effect over 294,912 outputs (least-squares slope, residual over signal): with an update of the
    size of a bf16 step of the outputs it arrives whole, with half the noise of merging it into
    bf16 weights; with one ten times smaller, each output's change is mostly below half a bf16
    step and about 60% of it rounds away, while merging keeps it on average under noise 3.5x its
    size (measured; the bounds below leave room)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(576, 576, generator=g) * 0.05
    a, b = torch.randn(16, 576, generator=g) / 24, torch.randn(576, 16, generator=g) * b_std
    x = torch.randn(512, 576, generator=g).to(torch.bfloat16)
    lin = torch.nn.Linear(576, 576, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w.to(torch.bfloat16))
        y_base = lin(x)
        want = x.float() @ (b @ a).T  # the update's effect in float32
        model = torch.nn.Module()
        model.lin = lin
        LoraDelta(model).load({"lin.lora_A.weight": a, "lin.lora_B.weight": b}, 1.0)
        y_delta = model.lin(x)
        assert torch.equal(y_delta, y_base + ((x.float() @ a.T) @ b.T).to(torch.bfloat16))
        merged = (x @ (w + b @ a).to(torch.bfloat16).T).float() - y_base.float()
    delta = y_delta.float() - y_base.float()

    def fit(got):
        return float((got * want).sum() / (want * want).sum()), float((got - want).std() / want.std())

    (s_d, r_d), (s_m, r_m) = fit(delta), fit(merged)
    assert 0.95 < s_m < 1.05  # merged: unbiased over the weights' positions on the bf16 grid ...
    if b_std == 2e-3:
        assert 0.95 < s_d < 1.05 and r_d < 0.6 * r_m, (s_d, r_d, r_m)
    else:  # ... but noisy; the delta loses most of an update under half a step of its outputs
        assert 0.2 < s_d < 0.6 and r_m > 2.5, (s_d, r_m)
