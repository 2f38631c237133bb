"""Clipped policy-gradient losses: GRPO (token-level ratio), GSPO and GSPO-token (sequence-level
ratio), with separate low/high clip ranges and the field's three loss aggregations.

Notation (METHODS.md): l_t = log pi_theta(y_t) - log pi_old(y_t), A_i the sample's advantage,
m_t the loss mask (1 = a token the policy generated, 0 = prompt, observation, padding).

- GRPO (arXiv 2402.03300, eq. 3; DAPO clip-higher arXiv 2503.14476):
  L_t = -min(rho_t A, clip(rho_t, 1 - eps_lo, 1 + eps_hi) A),  rho_t = exp(l_t).
- GSPO (arXiv 2507.18071, eq. 5-7): s_i = exp((1/|y_i|) sum_t m_t l_t), computed in log space;
  L_i = -min(s_i A_i, clip(s_i, 1 - eps_lo, 1 + eps_hi) A_i), averaged over sequences.
- GSPO-token (arXiv 2507.18071, eq. 13): s_{i,t} = sg[s_i] * exp(log pi_theta(y_t) - sg[log pi_theta(y_t)]),
  same value as s_i, per-token gradient; clipped like GSPO.

Aggregations (``agg``), one implementation for every loss (:func:`agg_loss`):
- ``token_mean``: sum_{i,t} m L / sum_{i,t} m (DAPO);
- ``seq_mean_token_mean``: mean_i (sum_t m L / sum_t m) (original GRPO, GSPO);
- ``seq_mean_token_sum_norm``: mean_i (sum_t m L / max_len) (Dr. GRPO, arXiv 2503.20783).
"""

from __future__ import annotations

from typing import Literal

import torch

Agg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
Level = Literal["token", "sequence", "sequence_token"]
AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: Agg,
    *,
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token ``values`` ``[B, T]`` under ``mask`` ``[B, T]`` to a scalar.

    ``num_tokens`` / ``num_seqs`` override the denominators with global counts (the whole batch's
    masked tokens / sequences with at least one masked token): summing the micro-batch losses
    then gives exactly the loss, and gradient, of the whole batch. Sequences with no masked
    token (e.g. a truncated completion masked out) count in no denominator.

    Raises:
        ValueError: unknown ``agg``; ``seq_mean_token_sum_norm`` without ``max_len``.
    """
    m = mask.to(values.dtype)
    if agg == "token_mean":
        denom = m.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
        return (values * m).sum() / denom.clamp_min(1.0)
    seq_tokens = m.sum(-1)
    live = (seq_tokens > 0).to(values.dtype)
    n_seqs = live.sum() if num_seqs is None else torch.as_tensor(num_seqs, dtype=values.dtype)
    if agg == "seq_mean_token_mean":
        per_seq = (values * m).sum(-1) / seq_tokens.clamp_min(1.0)
    elif agg == "seq_mean_token_sum_norm":
        if max_len is None or max_len <= 0:
            raise ValueError("agg='seq_mean_token_sum_norm' (Dr. GRPO) needs max_len > 0")
        per_seq = (values * m).sum(-1) / float(max_len)
    else:
        raise ValueError(f"agg {agg!r} is not one of {AGGS}")
    return (per_seq * live).sum() / n_seqs.clamp_min(1.0)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` length-normalised log of GSPO's sequence ratio: (1/|y_i|) sum_t m_t (logp - old_logp).
    0 for a sequence with no masked token."""
    m = mask.to(logp.dtype)
    return ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp_min(1.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: Agg = "token_mean",
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (see the module docstring for the formulas).

    Args:
        logp: ``[B, T]`` log pi_theta of the sampled tokens (differentiable).
        old_logp: ``[B, T]`` log pi_old (behaviour policy), treated as constants.
        advantages: ``[B]`` one advantage per sequence.
        mask: ``[B, T]`` 1 for tokens the policy generated, else 0.
        level: ``token`` (GRPO), ``sequence`` (GSPO) or ``sequence_token`` (GSPO-token).
        clip_low, clip_high: eps_lo, eps_hi of the clip range [1 - eps_lo, 1 + eps_hi].
        agg, max_len, num_tokens, num_seqs: see :func:`agg_loss`. GSPO is defined with
            ``seq_mean_token_mean`` only.

    Returns:
        ``(loss, metrics)``: scalar loss; metrics ``clip_frac`` (fraction of masked tokens, or of
        sequences for GSPO, whose clipped branch was taken), ``ratio_mean``, ``approx_kl_old``
        (mean of -l over masked tokens) as Python floats.

    Raises:
        ValueError: shapes disagree, unknown ``level`` or ``agg``, GSPO with another aggregation.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} != [B]={logp.shape[0]}")
    old_logp = old_logp.detach()
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    if level == "token":
        log_ratio = logp - old_logp
        ratio = torch.exp(log_ratio)
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(lo, hi)
        per_token = torch.maximum(unclipped, clipped)
        loss = agg_loss(per_token, mask, agg, max_len=max_len, num_tokens=num_tokens, num_seqs=num_seqs)
        clip_hit = ((clipped > unclipped).to(logp.dtype) * m).sum() / m.sum().clamp_min(1.0)
        ratio_mean = (ratio.detach() * m).sum() / m.sum().clamp_min(1.0)
    elif level in ("sequence", "sequence_token"):
        if agg != "seq_mean_token_mean":
            raise ValueError(f"GSPO is defined with agg='seq_mean_token_mean' only (arXiv 2507.18071, eq. 5), got {agg!r}")
        log_s = sequence_log_ratio(logp, old_logp, mask)  # [B]
        if level == "sequence":
            s = torch.exp(log_s)  # finite: length-normalised, per-token log-ratios are O(1)
            unclipped = -advantages.to(s.dtype) * s
            clipped = -advantages.to(s.dtype) * s.clamp(lo, hi)
            per_seq = torch.maximum(unclipped, clipped)
            live = (m.sum(-1) > 0).to(s.dtype)
            n = live.sum() if num_seqs is None else torch.as_tensor(num_seqs, dtype=s.dtype)
            loss = (per_seq * live).sum() / n.clamp_min(1.0)
            clip_hit = ((clipped > unclipped).to(s.dtype) * live).sum() / live.sum().clamp_min(1.0)
            ratio_mean = (s.detach() * live).sum() / live.sum().clamp_min(1.0)
        else:
            s_tok = torch.exp(log_s.detach().unsqueeze(-1) + logp - logp.detach())  # [B, T], value = s_i
            unclipped = -adv * s_tok
            clipped = -adv * s_tok.clamp(lo, hi)
            per_token = torch.maximum(unclipped, clipped)
            loss = agg_loss(per_token, mask, agg, num_seqs=num_seqs)
            clip_hit = ((clipped > unclipped).to(logp.dtype) * m).sum() / m.sum().clamp_min(1.0)
            ratio_mean = (s_tok.detach() * m).sum() / m.sum().clamp_min(1.0)
    else:
        raise ValueError(f"level {level!r} is not one of 'token', 'sequence', 'sequence_token'")
    approx_kl = (-(logp.detach() - old_logp) * m).sum() / m.sum().clamp_min(1.0)
    return loss, {"clip_frac": float(clip_hit), "ratio_mean": float(ratio_mean), "approx_kl_old": float(approx_kl)}
