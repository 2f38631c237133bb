"""A faster attention for sampling on the CPU: one-token decode steps as two batched matmuls.

PyTorch's CPU kernel for ``scaled_dot_product_attention`` (``_scaled_dot_product_flash_attention
_for_cpu``) tiles over query blocks; a decode step has one query per sequence, so most of each
tile is overhead. Measured on this repository's 2-core CPU with SmolLM2-135M's shapes (batch 28,
9 query heads over 3 key/value heads, 300 keys, head size 64, bf16): 5.5 ms per call for the
kernel, 0.74 ms for ``softmax(q k^T * scale + mask) v`` as two grouped matmuls; the kernel was 55%
of a decode step's time.

:func:`decode_attention_forward` computes exactly that for a query of length 1 (the scores and
the softmax in float32, as transformers' eager attention does) and hands every other call
(prefill, training, dropout) to transformers' own SDPA attention unchanged. It is registered with
transformers' attention and mask interfaces as :data:`NAME`; a model opts in with
``model.set_attn_implementation(NAME)`` (:func:`use_decode_attention`).
"""

from __future__ import annotations

from typing import Any

NAME = "harnessrl_decode"


def decode_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                             dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention-function signature.

    Args:
        query: ``[B, H, Q, D]``; key, value: ``[B, KV, L, D]`` with ``H`` a multiple of ``KV``
            (grouped-query attention), any float dtype.
        attention_mask: None, a bool mask (True = attend) or an additive float mask, broadcastable
            to ``[B, 1 or H, Q, L]`` (transformers' SDPA mask; its last ``L`` columns are used).
        scaling: the score scale (default ``D ** -0.5``).

    Returns:
        ``(attn_output [B, Q, H, D] in value's dtype, None)``.

    With ``Q == 1``, no dropout and no extra options (softcap, sliding window, sinks): the
    grouped matmul path; otherwise :func:`transformers.integrations.sdpa_attention.
    sdpa_attention_forward` with the same arguments.
    """
    import torch

    extra = {k for k, v in kwargs.items() if v is not None and k not in ("is_causal", "position_ids", "cache_position")}
    if query.shape[2] != 1 or (dropout and module.training) or extra:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, _, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    rep = h // kv
    scale = d ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv, rep, d)  # one query token: the rep query heads of a KV head side by side
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [B, KV, rep, L]
    if attention_mask is not None:
        m = attention_mask[..., -length:]
        if m.shape[1] == h:
            m = m.reshape(m.shape[0], kv, rep, length)
        else:  # one mask for every head: [B, 1, 1, L] broadcasts over (KV, rep)
            m = m.reshape(m.shape[0], 1, 1, length)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, KV, rep, D]
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


def use_decode_attention(model: Any) -> Any:
    """Register :data:`NAME` (attention: :func:`decode_attention_forward`; masks: transformers'
    SDPA masks) and switch ``model`` to it; returns ``model``. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, decode_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model
