"""A peft LoRA adapter, unmerged, as forward hooks on the base model's linear layers: peft's numbers
in fewer ops.

The ``hf`` engine keeps an adapter unmerged beside the bf16 base weights (merged into bf16, a few
steps' update is mostly rounded away: :mod:`tasks.rollout.engines.hf`). Per adapted layer, peft's
``lora.Linear`` computes ``(W x + (B (A x.float())) * s).to(bf16)`` in six tensor ops and three
module calls: a float32 copy of ``x``, ``lora_A``, ``lora_B``, the scale (a new tensor), the add
(the bf16 output promoted to a new float32 tensor) and the cast back. :func:`hook_lora` takes the
factors out of a loaded peft model and adds the same update with one forward hook per layer:
``delta = (s B) (A x.float())`` and ``output.add_(delta)``, which torch computes in float32 and
rounds once to bf16, as peft's add and cast do. The scale is folded into ``B``
when it is a power of two (``alpha / r`` = 16 / 8 in every shipped config: exact), else applied to
``delta`` as peft applies it, so the logits are peft's bit for bit (``tests/rollout/test_hf_lora.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch


class _Hook:
    """One adapted layer: ``A`` (``[r, in]``), ``B`` (``[out, r]``, scaled when ``scale`` is None)
    and the scale still to apply (None when folded), float32; the products are peft's own
    (``F.linear``, as ``lora_A`` and ``lora_B`` compute them)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scale: float | None):
        self.a, self.b, self.scale = a, b, scale

    def __call__(self, module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        linear = torch.nn.functional.linear
        delta = linear(linear(args[0].float(), self.a), self.b)
        if self.scale is not None:
            delta.mul_(self.scale)
        return output.add_(delta)  # float32 arithmetic, one rounding to the output's dtype


class LoraHooks:
    """The hooks :func:`hook_lora` installed (``layers``: how many); :meth:`remove` takes them off."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    @property
    def layers(self) -> int:
        return len(self.handles)

    def remove(self) -> None:
        """Take every hook off: the model computes its base weights alone again."""
        for h in self.handles:
            h.remove()
        self.handles = []


def _unsupported(layer: Any, name: str) -> str:
    """Why ``layer`` (a peft LoRA layer) cannot be hooked for adapter ``name``, or "" if it can."""
    from peft.tuners.lora.layer import Linear

    if type(layer) is not Linear:
        return f"{type(layer).__name__} is not a plain lora.Linear"
    if not isinstance(layer.get_base_layer(), torch.nn.Linear):
        return f"its base layer is a {type(layer.get_base_layer()).__name__}"
    if layer.merged or layer.disable_adapters:
        return "merged or disabled"
    if list(layer.active_adapters) != [name] or name not in layer.lora_A:
        return f"active adapters {list(layer.active_adapters)}"
    if name in getattr(layer, "lora_variant", {}) or layer.use_dora.get(name, False):
        return "a LoRA variant (DoRA, ...)"
    if layer.lora_bias.get(name, False) or layer.fan_in_fan_out:
        return "lora_bias or fan_in_fan_out"
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity) and layer.lora_dropout[name].p > 0:
        return "dropout"
    return ""


def hook_lora(peft_model: Any) -> tuple[Any, LoraHooks | None]:
    """The base model of ``peft_model`` (a peft ``PeftModel`` with one active LoRA adapter, loaded
    for inference) with the adapter applied by forward hooks, unmerged, in float32 (module
    docstring); or ``(peft_model, None)`` unchanged when any adapted layer is of a kind the hooks do
    not cover (DoRA and other variants, LoRA biases, dropout, a non-linear base layer, several
    adapters), so peft's own path runs it.

    The returned model is peft's ``unload()`` (the base model, its layers put back) with the hooks
    on its linear layers; for generation only (``torch.inference_mode``/``no_grad``): the hooks add
    into the layers' outputs in place.
    """
    from peft.tuners.lora.layer import LoraLayer

    name = peft_model.active_adapter
    layers = [m for m in peft_model.modules() if isinstance(m, LoraLayer)]
    if not layers or any(_unsupported(m, name) for m in layers):
        return peft_model, None
    targets = []
    for m in layers:
        s = float(m.scaling[name])
        exact = s > 0 and math.frexp(s)[0] == 0.5  # a power of two: folding it into B rounds nothing
        b = m.lora_B[name].weight.detach().float()
        targets.append((m.get_base_layer(), _Hook(m.lora_A[name].weight.detach().float(), b * s if exact else b,
                                                  None if exact else s)))
    base = peft_model.unload()
    hooks = LoraHooks()
    for linear, hook in targets:
        hooks.handles.append(linear.register_forward_hook(hook))
    return base, hooks
