"""transformers' ``sdpa`` attention, except on the CPU with a mask and grouped key/value heads.

For a model with grouped-query attention (fewer key/value heads than query heads: SmolLM2, the
tiny test models) and a mask (any left-padded batch), transformers' ``sdpa`` does not hand the
groups to torch's kernel (``enable_gqa``): that would fall back to the math kernel on CUDA. It
copies the key/value heads (``repeat_kv``) or, when decoding, folds the query heads into a longer
query (``pack_gqa``). On the CPU in float32, torch's kernel takes the groups directly and a
128-row decode step's attention runs about twice as fast; in bfloat16 the same call is several
times slower than ``pack_gqa`` (torch 2.13). :data:`NAME` is registered with transformers'
``AttentionInterface`` (and ``sdpa``'s mask with ``AttentionMaskInterface``). On the CPU in
float32 with a mask and grouped heads it calls ``torch.nn.functional.scaled_dot_product_attention(
..., enable_gqa=True)``; every other call goes to transformers' own ``sdpa``. The outputs equal
``sdpa``'s up to the kernels' order of summation (tests: logits to 1e-5, sampled tokens).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "harnessrl_sdpa"


def sdpa_cpu_gqa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                 scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """An attention function with transformers' signature: ``query`` ``[B, H, q, D]``, ``key``
    and ``value`` ``[B, Hkv, kv, D]``, ``attention_mask`` ``[B, 1, q, kv]`` (bool or additive) or
    None; returns ``([B, q, H, D], None)``."""
    grouped = key.shape[1] != query.shape[1]
    if (attention_mask is None or not grouped or query.device.type != "cpu" or query.dtype != torch.float32
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # with a mask, sdpa's causal flag is off (transformers: is_causal = q > 1 and mask is None and ...)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_cpu_gqa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_cpu_gqa_attention(model: Any) -> Any:
    """Switch ``model`` (a transformers model, or a peft model around one) from ``sdpa`` to
    :data:`NAME`; a model on any other attention implementation is left as it is. Returns
    ``model``."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(inner.config, "_attn_implementation", None) == "sdpa":
        inner.set_attn_implementation(NAME)
    return model
