"""Log-probabilities of sampled tokens under the sampler's processed distribution, whole or in
chunks of tokens (:func:`chunked_logprobs`: the trainer's path, whose memory does not grow with
the number of tokens)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

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


def chunked_logprobs(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor, *,
                     temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, chunk: int = 256,
                     with_entropy: bool = False, autocast_ctx: Callable[[], Any] = contextlib.nullcontext
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``targets`` ``[N]`` (long) given final hidden states ``hidden``
    ``[N, H]`` and the output projection ``head`` (hidden ``[n, H]`` -> logits ``[n, V]``, run
    under ``autocast_ctx``), ``chunk`` tokens at a time, so that no ``[N, V]`` tensor exists.

    Each chunk computes exactly what :func:`token_logprobs` (log-probs under the processed
    distribution: temperature, top-k, top-p) and :func:`entropy_from_logits` (entropy of
    softmax(logits / temperature), detached) compute on that chunk's rows; the values equal the
    unchunked computation's to float rounding. When ``hidden`` needs a gradient, each chunk runs
    under ``torch.utils.checkpoint``: its forward keeps only its ``[n, H]`` input and its ``[n]``
    output, and the backward recomputes the chunk's projection and processing, one chunk at a
    time. The gradient reaches ``hidden`` and any trainable weight of ``head`` (none under LoRA
    on SmolLM2: the head is the frozen, tied embedding).

    Returns:
        float32 ``[N]`` log-probs (``-inf`` outside the top-k/top-p support) and float32 ``[N]``
        entropies (nats; None unless ``with_entropy``), on ``hidden``'s device.

    Raises:
        ValueError: ``chunk`` < 1, ``hidden`` and ``targets`` of different lengths, or bad
            processing settings (:func:`process_logits`).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} do not line up "
                         "(want [N, H] and [N])")

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast_ctx():
            logits = head(h)  # [n, V]
        lp = token_logprobs(logits, t, temperature=temperature, top_k=top_k, top_p=top_p)
        ent = None
        if with_entropy:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach(), temperature=temperature)
        return lp, ent

    from torch.utils.checkpoint import checkpoint

    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", lambda: [])()))
    lps, ents = [], []
    for a in range(0, hidden.shape[0], chunk):
        h, t = hidden[a:a + chunk], targets[a:a + chunk]
        lp, ent = checkpoint(piece, h, t, use_reentrant=False, preserve_rng_state=False) if grad else piece(h, t)
        lps.append(lp)
        ents.append(ent)
    if not lps:  # no token: empty outputs of the right kind
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)
