"""Clipped policy-gradient losses: GRPO (token-level ratio), GSPO and GSPO-token (sequence-level
ratio), with separate low/high clip ranges, the field's three loss aggregations and optional
truncated importance-sampling weights.

Notation (docs/methods/index.md): l_t = log pi_theta(y_t) - log pi_old(y_t), A_i the sample's advantage,
m_t the loss mask (1 = a token the policy generated, 0 = prompt, observation, padding).

- GRPO (arXiv 2402.03300, eq. 3; DAPO clip-higher arXiv 2503.14476):
  L_t = -min(rho_t A, clip(rho_t, 1 - eps_lo, 1 + eps_hi) A),  rho_t = exp(l_t).
- GSPO (arXiv 2507.18071, eq. 5-7): s_i = exp((1/|y_i|) sum_t m_t l_t), computed in log space;
  L_i = -min(s_i A_i, clip(s_i, 1 - eps_lo, 1 + eps_hi) A_i), averaged over sequences.
- GSPO-token (arXiv 2507.18071, eq. 13): s_{i,t} = sg[s_i] * exp(log pi_theta(y_t) - sg[log pi_theta(y_t)]),
  same value as s_i, per-token gradient; clipped like GSPO.
- Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training", as in verl's ``tis_imp_ratio_cap``): when the old log-probs
  are the trainer's recomputation but the tokens were drawn by another engine (the behaviour
  policy pi_beh), each loss term is weighted by w = min(pi_old / pi_beh, C) (per token for GRPO,
  length-normalised per sequence for GSPO), a constant (no gradient).

Masked positions never reach an ``exp``: ``logp`` and ``old_logp`` are replaced by 0 there before
any arithmetic, so any value at a masked position (a large log-ratio, inf, NaN) leaves the loss
and its gradient exactly as they are with zeros there.

Aggregations (``agg``), one implementation for every loss (:func:`agg_loss`), are the entries of
:data:`tasks.registries.LOSS_AGGREGATIONS` (``token_mean``, ``seq_mean_token_mean``,
``seq_mean_token_sum_norm`` and any added there).
"""

from __future__ import annotations

from typing import Literal

import torch

from tasks.registries import LOSS_AGGREGATIONS

Level = Literal["token", "sequence", "sequence_token"]
LEVELS = ("token", "sequence", "sequence_token")


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with every position where ``mask`` is 0 replaced by 0 (same shape and dtype).

    Unlike ``values * mask`` this is exact for inf / NaN at masked positions, and the gradient
    there is 0 (``torch.where`` routes no gradient to the unselected branch)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    *,
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token ``values`` ``[B, T]`` under ``mask`` ``[B, T]`` to a scalar, by the
    aggregation ``agg`` of :data:`tasks.registries.LOSS_AGGREGATIONS`.

    ``num_tokens`` / ``num_seqs`` override the denominators with global counts (the whole
    mini-batch's masked tokens / sequences with at least one masked token): summing the
    micro-batch losses then gives exactly the loss, and gradient, of the whole mini-batch.
    Sequences with no masked token (e.g. a truncated completion masked out) count in no
    denominator. Values at masked positions are ignored, whatever they are.

    Raises:
        ValueError: unknown ``agg``; ``seq_mean_token_sum_norm`` without ``max_len``.
    """
    aggregation = LOSS_AGGREGATIONS.get(agg)
    m = mask.to(values.dtype)
    v = masked(values, mask)
    n_tokens = None if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
    n_seqs = None if num_seqs is None else torch.as_tensor(num_seqs, dtype=values.dtype)
    return aggregation.aggregate(v, m, max_len=max_len, num_tokens=n_tokens, num_seqs=n_seqs)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` length-normalised log of GSPO's sequence ratio: (1/|y_i|) sum_t m_t (logp - old_logp).
    0 for a sequence with no masked token; masked positions are ignored whatever their values."""
    m = mask.to(logp.dtype)
    return masked(logp - old_logp, mask).sum(-1) / m.sum(-1).clamp_min(1.0)


def truncated_is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cap: float,
                         level: Level = "token") -> torch.Tensor:
    """Truncated importance-sampling weights for sampler/trainer mismatch (see the module docstring).

    Args:
        old_logp: ``[B, T]`` the trainer's log-probs of the sampled tokens (the proximal "old" policy).
        behaviour_logp: ``[B, T]`` the sampling engine's log-probs of the same tokens.
        mask: ``[B, T]`` 1 for policy tokens.
        cap: C > 0, the truncation.
        level: ``token`` gives ``[B, T]`` weights min(exp(old_t - beh_t), C) (1 at masked
            positions); ``sequence`` / ``sequence_token`` give ``[B]`` weights
            min(exp(mean_t(old_t - beh_t)), C) (length-normalised like GSPO's ratio).

    Returns a float tensor without gradient. Raises ValueError for cap <= 0 or an unknown level.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    with torch.no_grad():
        if level == "token":
            return torch.exp(masked(old_logp - behaviour_logp, mask)).clamp(max=cap)
        if level in ("sequence", "sequence_token"):
            return torch.exp(sequence_log_ratio(old_logp, behaviour_logp, mask)).clamp(max=cap)
    raise ValueError(f"level {level!r} is not one of {LEVELS}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token_mean",
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (see the module docstring for the formulas).

    Args:
        logp: ``[B, T]`` log pi_theta of the sampled tokens (differentiable).
        old_logp: ``[B, T]`` log pi_old (behaviour or proximal policy), treated as constants.
        advantages: ``[B]`` one advantage per sequence.
        mask: ``[B, T]`` 1 for tokens the policy generated, else 0. Values of ``logp`` and
            ``old_logp`` at masked positions are never used.
        level: ``token`` (GRPO), ``sequence`` (GSPO) or ``sequence_token`` (GSPO-token).
        clip_low, clip_high: eps_lo, eps_hi of the clip range [1 - eps_lo, 1 + eps_hi].
        agg, max_len, num_tokens, num_seqs: see :func:`agg_loss`. GSPO is defined with
            ``seq_mean_token_mean`` only.
        weights: optional constant weights of each loss term (:func:`truncated_is_weights`):
            ``[B, T]`` for ``token``, ``[B]`` for the sequence levels.

    Returns:
        ``(loss, metrics)``: scalar loss; metrics ``clip_frac`` (fraction of masked tokens, or of
        sequences for GSPO, whose clipped branch was taken), ``ratio_mean``, ``ratio_min``,
        ``ratio_max`` (of rho_t over masked tokens, or of s_i over sequences with a masked
        token; 1.0 when there is none), ``approx_kl_old`` (mean of -l over masked tokens), as
        Python floats.

    Raises:
        ValueError: shapes disagree, unknown ``level`` or ``agg``, GSPO with another aggregation.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} != [B]={logp.shape[0]}")
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {LEVELS}")
    want_w = logp.shape if level == "token" else logp.shape[:1]
    if weights is not None and weights.shape != want_w:
        raise ValueError(f"weights shape {tuple(weights.shape)} != {tuple(want_w)} for level {level!r}")
    sel = mask.bool()
    logp = masked(logp, mask)
    old_logp = masked(old_logp.detach(), mask)
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    if level == "token":
        ratio = torch.exp(logp - old_logp)  # exactly 1 at masked positions
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(lo, hi)
        per_token = torch.maximum(unclipped, clipped)
        if weights is not None:
            per_token = per_token * weights.to(per_token.dtype).detach()
        loss = agg_loss(per_token, mask, agg, max_len=max_len, num_tokens=num_tokens, num_seqs=num_seqs)
        clip_hit = ((clipped > unclipped).to(logp.dtype) * m).sum() / m.sum().clamp_min(1.0)
        live_ratio = ratio.detach()[sel]
    else:
        if agg != "seq_mean_token_mean":
            raise ValueError(f"GSPO is defined with agg='seq_mean_token_mean' only (arXiv 2507.18071, eq. 5), got {agg!r}")
        log_s = sequence_log_ratio(logp, old_logp, mask)  # [B]
        live = (m.sum(-1) > 0).to(logp.dtype)
        w = weights.to(logp.dtype).detach() if weights is not None else None
        if level == "sequence":
            s = torch.exp(log_s)  # finite: length-normalised, per-token log-ratios are O(1)
            unclipped = -advantages.to(s.dtype) * s
            clipped = -advantages.to(s.dtype) * s.clamp(lo, hi)
            per_seq = torch.maximum(unclipped, clipped)
            if w is not None:
                per_seq = per_seq * w
            n = live.sum() if num_seqs is None else torch.as_tensor(num_seqs, dtype=s.dtype)
            loss = (per_seq * live).sum() / n.clamp_min(1.0)
            clip_hit = ((clipped > unclipped).to(s.dtype) * live).sum() / live.sum().clamp_min(1.0)
        else:
            s_tok = torch.exp(log_s.detach().unsqueeze(-1) + logp - logp.detach())  # [B, T], value = s_i
            unclipped = -adv * s_tok
            clipped = -adv * s_tok.clamp(lo, hi)
            per_token = torch.maximum(unclipped, clipped)
            if w is not None:
                per_token = per_token * w.unsqueeze(-1)
            loss = agg_loss(per_token, mask, agg, num_seqs=num_seqs)
            clip_hit = ((clipped > unclipped).to(logp.dtype) * m).sum() / m.sum().clamp_min(1.0)
        live_ratio = torch.exp(log_s.detach())[live.bool()]
    approx_kl = (-(logp.detach() - old_logp) * m).sum() / m.sum().clamp_min(1.0)
    if live_ratio.numel():
        r_mean, r_min, r_max = float(live_ratio.mean()), float(live_ratio.min()), float(live_ratio.max())
    else:
        r_mean = r_min = r_max = 1.0
    return loss, {"clip_frac": float(clip_hit), "ratio_mean": r_mean, "ratio_min": r_min, "ratio_max": r_max,
                  "approx_kl_old": float(approx_kl)}
