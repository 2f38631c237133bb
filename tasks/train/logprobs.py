"""Log-probabilities of sampled tokens under the sampler's processed distribution."""

from __future__ import annotations

import torch


def process_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Apply the sampler's processing to ``logits`` ``[..., V]``, returning float32 logits with the
    excluded tokens at ``-inf``: divide by ``temperature``, keep the ``top_k`` largest, then keep
    the smallest set whose probability reaches ``top_p``. Same order and tie rules as the
    transformers warpers (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper), so the
    result matches what ``generate`` sampled from.

    Raises:
        ValueError: temperature <= 0, top_k < 0 or top_p outside (0, 1].
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    x = logits.float() / temperature
    if top_k is not None and top_k > 0:
        k = min(top_k, x.shape[-1])
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    elif top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and top_p < 1.0:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, float("-inf"))
    return x


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """``[B, T]`` float32 log-probs of ``token_ids`` ``[B, T]`` under ``logits`` ``[B, T, V]``
    processed as the rollout sampler processed them (:func:`process_logits`): exactly the
    behaviour-policy log-probs needed for importance ratios. Differentiable w.r.t. ``logits``.
    A token outside the top-k/top-p support gets ``-inf``.

    Raises:
        ValueError: shapes do not line up.
    """
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and token_ids {tuple(token_ids.shape)} do not line up")
    x = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    picked = x.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


def entropy_from_logits(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` entropy (nats) of softmax(logits / temperature)."""
    x = logits.float() / temperature
    logp = torch.log_softmax(x, dim=-1)
    return -(logp.exp() * logp).sum(-1)
