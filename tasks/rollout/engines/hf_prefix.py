"""Keys and values carried from one turn of an episode to the next in the ``hf`` engine.

Turn t+1's prompt is turn t's prompt + completion + the observation (:mod:`tasks.rollout.harness`),
so its prefill recomputed every earlier token of the episode: in the default run's evaluation the
third turn's batch prefilled 27 rows x 314 columns to add about a hundred new tokens per row. A
:class:`PrefixState` keeps one row's keys and values after ``generate`` (the prompt and the
completion tokens that were fed back); the next call that gets it back with a prompt that extends
its tokens fills those positions of the cache from it and prefills only the rest.

A token's keys and values depend only on the tokens before it and its position among the real
tokens (``generate``'s position ids are the attention mask's cumsum), not on the batch's left
padding, so the filled cache holds what a full prefill computes, up to the matmuls' blocking (the
same approximation as :meth:`tasks.rollout.engines.hf.HFPolicy._shared_prompt_cache`; the tests
compare sampled tokens and log-probs with a full prefill). Whether a state is used depends only on
the prompts and the states the caller passes, never on earlier calls, so a run stays deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

#: most bytes of keys and values one ``generate`` batch keeps as states; a batch that would keep
#: more keeps none (its rows' next turn prefills in full). SmolLM2-135M: 23 KB per token.
MAX_STATE_BYTES = 1 << 30


@dataclass(frozen=True)
class PrefixState:
    """One row's keys and values: ``tokens`` (the token ids they cover, from the start of the
    prompt) and ``kv`` (``[layers, 2, kv_heads, len(tokens), head_dim]``, keys then values, in the
    cache's dtype, on the model's device)."""

    tokens: tuple[int, ...]
    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def usable(prompts: Sequence[Sequence[int]], states: Sequence[PrefixState | None] | None) -> int:
    """The cache columns the batch can take from ``states``: with the prompts left-padded to the
    widest (``W``), the first ``W - K`` columns, where ``K`` is the most tokens any row's prompt
    has beyond its state. 0 (prefill everything) unless every row has a state whose tokens start
    its prompt and are shorter than it."""
    if not states or len(states) != len(prompts):
        return 0
    rest = 0
    for p, s in zip(prompts, states):
        n = len(s.tokens) if s is not None else 0
        if s is None or n >= len(p) or tuple(p[:n]) != s.tokens:
            return 0
        rest = max(rest, len(p) - n)
    return max(len(p) for p in prompts) - rest


def fill(cache: Any, prompts: Sequence[Sequence[int]], states: Sequence[PrefixState], columns: int) -> Any:
    """Write the first ``columns`` columns (:func:`usable`) of every layer of ``cache`` (an empty
    transformers ``Cache``) from ``states``: row ``i``'s prompt starts at column ``W - len(p_i)``
    (left padding, zeros in the cache: the attention mask hides them). Returns ``cache``."""
    width = max(len(p) for p in prompts)
    ref = states[0].kv
    layers, _, heads, _, dim = ref.shape
    for layer in range(layers):
        kv = ref.new_zeros((2, len(prompts), heads, columns, dim))
        for i, (p, s) in enumerate(zip(prompts, states)):
            pad = width - len(p)
            if columns > pad:
                kv[:, i, :, pad:columns] = s.kv[layer, :, :, :columns - pad]
        cache.update(kv[0], kv[1], layer)
    return cache


def keep(cache: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], steps: int
         ) -> list[PrefixState | None]:
    """Each row's :class:`PrefixState` after ``generate``: its prompt and the completion tokens that
    were fed back into the model (a batch of ``steps`` decoding steps feeds its first ``steps - 1``
    tokens; a row that stopped earlier, all of its completion up to and including EOS).

    ``cache`` must be the one ``generate`` filled (layers with ``keys``/``values`` ``[B, kv_heads,
    columns, head_dim]``); rows are in ``prompts`` order. All None when the states would take more
    than :data:`MAX_STATE_BYTES` or the cache has no per-layer ``keys``.
    """
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        return [None] * len(prompts)
    width = max(len(p) for p in prompts)
    fed = [min(len(c), max(steps - 1, 0)) for c in completions]
    k0 = layers[0].keys
    per_token = 2 * len(layers) * k0.shape[1] * k0.shape[3] * k0.element_size()
    if sum(len(p) + n for p, n in zip(prompts, fed)) * per_token > MAX_STATE_BYTES:
        return [None] * len(prompts)
    out: list[PrefixState | None] = []
    for i, (p, c, n) in enumerate(zip(prompts, completions, fed)):
        a, b = width - len(p), width + n
        if b > layers[0].keys.shape[2]:
            out.append(None)
            continue
        kv = torch.stack([torch.stack((layer.keys[i, :, a:b], layer.values[i, :, a:b])) for layer in layers])
        out.append(PrefixState(tuple(p) + tuple(c[:n]), kv))
    return out
