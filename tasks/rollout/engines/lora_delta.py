"""A LoRA adapter applied beside a model's linear layers, unmerged, in float32: ``y = W x + s B A x``.

Used by the vLLM worker (``policy.vllm.lora: delta``) to serve the base weights in bf16 with the
adapter beside them: the update ``s B A x`` is computed from float32 factors and added, rounded
once to bf16, to each adapted layer's bf16 output -- what peft computes in the trainer under bf16
autocast, so the engine and the trainer agree. (Merged into bf16 weights instead, the update is
kept on average but each weight's share is either lost or a whole bf16 step: noisier, and not
what the trainer computes; an output change under half a bf16 step of the output is rounded away
either way, ``tests/rollout/test_lora_delta.py`` measures both.) Syncing a new policy copies only
the adapter's factors into the buffers the hooks read (in place: no new tensors, so nothing that
captured them goes stale).

Torch and the standard library only: it is imported by the worker in vLLM's venv (started by file
path, so this module sits beside it) and by the tests in the main venv, where a plain transformers
model takes the place of vLLM's.

Packed layers: vLLM fuses ``q_proj``, ``k_proj``, ``v_proj`` into ``qkv_proj`` and ``gate_proj``,
``up_proj`` into ``gate_up_proj`` (the model's ``packed_modules_mapping``); the fused layer's output
is the sub-projections' outputs side by side (its ``output_sizes``). One packed layer's factors are
stacked: ``A = [A_q; A_k; A_v]`` (sum of ranks x in) and a block-diagonal ``B`` (out x sum of ranks),
so its delta is two small matmuls whatever the number of sub-projections.
"""

from __future__ import annotations

import re
from typing import Any

import torch

#: a peft adapter tensor name: ``[base_model.model.]<module path>.lora_<A|B>[.<adapter>].weight``
PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[\w-]+)?\.weight$")


class LoraDeltaError(ValueError):
    """Adapter tensors that do not fit the model (unknown module, shapes, a changed module set)."""


def peft_modules(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Group peft adapter tensors by the module they adapt: ``{module path: {"A": (r, in), "B": (out, r)}}``.

    Raises:
        LoraDeltaError: a name that is not a LoRA factor, a module missing A or B, or ranks that differ.
    """
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        m = PEFT_KEY.match(name)
        if m is None:
            raise LoraDeltaError(f"adapter tensor {name!r}: not a LoRA factor (…lora_A.weight / …lora_B.weight)")
        out.setdefault(m["module"], {})[m["ab"]] = t
    for mod, ab in out.items():
        if set(ab) != {"A", "B"}:
            raise LoraDeltaError(f"adapter module {mod!r}: has {sorted(ab)}, needs both lora_A and lora_B")
        if ab["A"].dim() != 2 or ab["B"].dim() != 2 or ab["A"].shape[0] != ab["B"].shape[1]:
            raise LoraDeltaError(f"adapter module {mod!r}: A {tuple(ab['A'].shape)} and B {tuple(ab['B'].shape)} "
                                 "are not (r, in) and (out, r)")
    return out


class _Target:
    """One model layer's delta: stacked A (R, in) and, per sub-projection, its pre-scaled B (rows,
    k) with the output rows and the columns of ``x A^T`` it reads; float32."""

    def __init__(self, a: torch.Tensor, blocks: list[tuple[int, int, int, int]], bs: list[torch.Tensor]):
        self.a, self.blocks, self.bs = a, blocks, bs  # blocks: (row0, row1, col0, col1)

    def __call__(self, module: Any, args: tuple, output: Any) -> Any:
        out, rest = (output[0], output[1:]) if isinstance(output, tuple) else (output, None)
        x = args[0]
        h = x.reshape(-1, x.shape[-1]).float() @ self.a.T  # (tokens, R)
        flat = out.view(-1, out.shape[-1])
        if len(self.bs) == 1 and self.blocks[0][0] == 0 and self.blocks[0][1] == flat.shape[-1]:
            flat += (h @ self.bs[0].T).to(out.dtype)
        else:
            for (r0, r1, c0, c1), b in zip(self.blocks, self.bs):
                flat[:, r0:r1] += (h[:, c0:c1] @ b.T).to(out.dtype)
        return output

class LoraDelta:
    """Forward hooks that add ``scale * B A x`` (float32) to the outputs of a model's adapted layers.

    Args:
        model: a ``torch.nn.Module`` (vLLM's model, or a transformers model in tests).
        packed: ``{fused layer name: [sub-projection names]}`` (vLLM's ``packed_modules_mapping``,
            e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``); a fused layer must have
            ``output_sizes`` (its sub-projections' output widths, in that order).
        device: where the factors live (the model's device).

    The first :meth:`load` installs a hook on every layer it names; each later load must name the
    same modules with the same shapes (in-place update). :meth:`remove` takes the hooks off.
    """

    def __init__(self, model: torch.nn.Module, packed: dict[str, list[str]] | None = None, device: Any = "cpu"):
        self.model, self.packed, self.device = model, dict(packed or {}), device
        self.modules = dict(model.named_modules())
        self.targets: dict[str, _Target] = {}
        self.handles: list[Any] = []
        self.names: tuple[str, ...] = ()

    def _locate(self, path: str) -> tuple[str, int, int, int]:
        """``(layer name, row0, row1, layer width)``: the layer that computes peft module ``path``,
        the rows of its output that are ``path``'s, and its whole output width."""
        if path in self.modules:
            layer = self.modules[path]
            width = int(getattr(layer, "output_size", 0) or getattr(layer, "out_features", 0) or 0)
            if not width:
                raise LoraDeltaError(f"adapter module {path!r}: the model's layer has no output width")
            return path, 0, width, width
        parent, _, leaf = path.rpartition(".")
        for fused, subs in self.packed.items():
            if leaf in subs and f"{parent}.{fused}" in self.modules:
                sizes = [int(s) for s in self.modules[f"{parent}.{fused}"].output_sizes]
                i = subs.index(leaf)
                return f"{parent}.{fused}", sum(sizes[:i]), sum(sizes[:i + 1]), sum(sizes)
        raise LoraDeltaError(f"adapter module {path!r}: no such layer in the served model")

    def load(self, tensors: dict[str, torch.Tensor], scale: float) -> dict[str, int]:
        """Set the adapter to ``tensors`` (peft names, any float dtype; kept in float32) at ``scale``
        (peft's ``lora_alpha / r``). Returns ``{"modules": adapted sub-projections, "layers": hooked
        layers, "params": factor elements}``.

        Raises:
            LoraDeltaError: a name or shape that does not fit the model, or (after the first load) a
                set of modules or shapes different from the first load's; nothing is changed then.
        """
        mods = peft_modules(tensors)
        names = tuple(sorted(mods))
        if self.names and names != self.names:
            missing, extra = sorted(set(self.names) - set(names)), sorted(set(names) - set(self.names))
            raise LoraDeltaError(f"adapter load names other modules than the first load: missing {missing[:3]}, "
                                 f"new {extra[:3]} ({len(missing)} missing, {len(extra)} new)")
        by_layer: dict[str, list[tuple[str, int, int, torch.Tensor, torch.Tensor]]] = {}
        widths: dict[str, int] = {}
        for path in names:
            layer, r0, r1, widths[layer] = self._locate(path)
            a, b = mods[path]["A"], mods[path]["B"]
            if b.shape[0] != r1 - r0:
                raise LoraDeltaError(f"adapter module {path!r}: B has {b.shape[0]} rows, the layer's output for it "
                                     f"has {r1 - r0}")
            by_layer.setdefault(layer, []).append((path, r0, r1, a, b))
        built: dict[str, _Target] = {}
        for layer, parts in by_layer.items():
            parts.sort(key=lambda p: p[1])
            ins = {p[3].shape[1] for p in parts}
            if len(ins) != 1:
                raise LoraDeltaError(f"layer {layer!r}: adapter A factors with different input widths {sorted(ins)}")
            rank = sum(p[3].shape[0] for p in parts)
            a = torch.empty(rank, ins.pop(), dtype=torch.float32, device=self.device)
            blocks, bs, c = [], [], 0
            for _, r0, r1, fa, fb in parts:
                k = fa.shape[0]
                a[c:c + k] = fa.float()
                bs.append((fb.float() * float(scale)).to(self.device).contiguous())
                blocks.append((r0, r1, c, c + k))
                c += k
            built[layer] = _Target(a, blocks, bs)
        if self.targets:
            for layer, t in built.items():
                old = self.targets[layer]
                if old.blocks != t.blocks or old.a.shape != t.a.shape:
                    raise LoraDeltaError(f"layer {layer!r}: factors A {tuple(t.a.shape)} in blocks {t.blocks}, the "
                                         f"first load's were A {tuple(old.a.shape)} in blocks {old.blocks}")
            for layer, t in built.items():  # in place: the hooks keep reading the same tensors
                self.targets[layer].a.copy_(t.a)
                for old_b, new_b in zip(self.targets[layer].bs, t.bs):
                    old_b.copy_(new_b)
        else:
            self.targets = built
            self.handles = [self.modules[layer].register_forward_hook(t) for layer, t in built.items()]
            self.names = names
        return {"modules": len(names), "layers": len(built),
                "params": sum(int(m["A"].numel() + m["B"].numel()) for m in mods.values())}

    def remove(self) -> None:
        """Take every hook off (the model computes the base weights alone again)."""
        for h in self.handles:
            h.remove()
        self.handles, self.targets, self.names = [], {}, ()
