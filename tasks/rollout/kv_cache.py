"""A key/value cache for transformers' ``generate`` that reserves room ahead instead of growing every step.

transformers' default ``DynamicLayer`` grows by ``torch.cat`` at every decode step, copying the
whole cache each time: O(T^2) bytes over T steps, the largest cost after the matmuls and
attention when ``benchmarks/train_step.py``'s 128-row batches are profiled. :class:`ReservedLayer`
writes each step's keys and values into a buffer with room for the prompt and some new tokens,
doubled when full (so the copies add up to less than the final size), and hands attention the
filled part, so attention sees the same values in the same shapes (``StaticCache`` would instead
attend over the whole reserved length under a mask: more attention work, and other numerics).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """One attention layer's cache: ``[B, heads, capacity, head_dim]`` buffers for keys and
    values, of which the first ``n`` positions are filled; ``keys``/``values`` are views of them.

    For inference only (``torch.inference_mode``/``no_grad``): updates write into the buffers in
    place, so autograd would refuse them, and a view handed out earlier sees later writes after a
    :meth:`crop`.

    Args:
        capacity: positions to reserve at first (the prompt's width and some new tokens), >= 1.
            An update past the room moves the cache into a buffer twice as large (one copy).
        limit: the most positions the layer will hold (prompt width + ``max_new_tokens``): growth
            stops there; None for no limit. An update past it still fits (the room becomes exactly
            what it needs).
    """

    def __init__(self, capacity: int, limit: int | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if limit is not None and limit < capacity:
            raise ValueError(f"limit must be >= capacity ({capacity}), got {limit}")
        super().__init__()
        self.capacity, self.limit = capacity, limit
        self.n = 0
        self._k: Any = None
        self._v: Any = None

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Append ``[B, heads, k, head_dim]`` keys and values; return all ``n + k`` positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        m = self.n + key_states.shape[-2]
        if self._k is None or m > self._k.shape[-2]:
            room = self.capacity if self._k is None else 2 * self._k.shape[-2]
            room = max(min(room, self.limit) if self.limit is not None else room, m)
            k = key_states.new_empty((*key_states.shape[:-2], room, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:-2], room, value_states.shape[-1]))
            if self.n:
                k[..., : self.n, :] = self._k[..., : self.n, :]
                v[..., : self.n, :] = self._v[..., : self.n, :]
            self._k, self._v = k, v
        self._k[..., self.n:m, :] = key_states
        self._v[..., self.n:m, :] = value_states
        self.n = m
        self.keys, self.values = self._k[..., :m, :], self._v[..., :m, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n

    def _rows(self, pick: Any) -> None:
        if self.n:
            self._k, self._v = pick(self._k), pick(self._v)
            self.keys, self.values = self._k[..., : self.n, :], self._v[..., : self.n, :]

    def batch_select_indices(self, indices: Any) -> None:
        """Keep rows ``indices`` (``[B']`` long; repeats allowed: a shared prompt to its rows)."""
        self._rows(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def reorder_cache(self, beam_idx: Any) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (transformers' convention: <= 0)."""
        if tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove must be <= 0 (positions to drop, negated), got {tokens_to_remove}")
        if self.n:
            self.n = max(0, self.n + tokens_to_remove)
            self.keys, self.values = self._k[..., : self.n, :], self._v[..., : self.n, :]

    def reset(self) -> None:
        self.n, self._k, self._v = 0, None, None
        super().reset()

    def _move(self, device: Any) -> None:
        if self._k is not None and self._k.device != device:
            self._k, self._v = self._k.to(device, non_blocking=True), self._v.to(device, non_blocking=True)
            self.keys, self.values = self._k[..., : self.n, :], self._v[..., : self.n, :]

    def offload(self) -> None:
        """Move the buffers to host memory (transformers' ``Cache(offloading=True)`` protocol)."""
        self._move(torch.device("cpu"))

    def prefetch(self) -> None:
        """Move the buffers back to the layer's device."""
        if self.is_initialized:
            self._move(self.device)


def reserved_cache(config: Any, capacity: int, limit: int | None = None) -> Cache | None:
    """A :class:`ReservedLayer` per layer for a model whose default cache is all plain
    ``DynamicLayer`` (full attention in every layer: Llama, SmolLM2, Qwen2 without a sliding
    window); None for any other layout (sliding windows, linear attention, shared KV), which
    then keeps transformers' own cache.

    Args:
        config: the model's ``PretrainedConfig``.
        capacity: positions each layer reserves at first (see :class:`ReservedLayer`).
        limit: the most positions a layer will hold, or None (see :class:`ReservedLayer`).
    """
    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return Cache(layers=[ReservedLayer(capacity, limit) for _ in layers])
