"""Where the KL(pi_theta || pi_ref) term goes and how it is computed per token, by the
estimators of :data:`tasks.registries.KL_ESTIMATORS` (k1, k2, k3 and any added there; P5:
docs/methods/p5-kl.md).

Which placement of which estimator gives an unbiased gradient of the sequence-level KL is P5's
table (Shah et al., arXiv 2512.21852), registered with each estimator; ``harnessrl kl-check``
verifies it by enumeration. The placements (``train.kl.placement``) are read here and nowhere else:
:func:`kl_in_reward` and :func:`kl_in_loss` say where the term goes, :func:`kl_penalized_rewards`
is the reward side and :func:`kl_loss_term` the loss side.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tasks.registries import KL_ESTIMATORS, LOG_RATIO_CLAMP, PLACEMENTS
from tasks.train.losses import agg_loss, masked


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, *,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate, same shape as ``logp`` (e.g. ``[B, T]``), in nats.

    Args:
        logp: log pi_theta of the sampled tokens (differentiable if the gradient is wanted).
        ref_logp: log pi_ref of the same tokens.
        kind: a name of :data:`tasks.registries.KL_ESTIMATORS` (``k1``, ``k2``, ``k3``, ...).
        mask: optional ``[B, T]`` (1 = policy token): the estimate is exactly 0 where it is 0,
            with zero gradient, whatever ``logp`` and ``ref_logp`` hold there (inf and NaN too).

    Raises:
        ValueError: unknown ``kind`` or shapes differ.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp shape {tuple(logp.shape)} != ref_logp shape {tuple(ref_logp.shape)}")
    if mask is not None:
        return masked(kl_estimate(masked(logp, mask), masked(ref_logp, mask), kind), mask)
    return KL_ESTIMATORS.get(kind).per_token(ref_logp - logp)


def importance_weighted(per_token: torch.Tensor, logp: torch.Tensor, behaviour_logp: torch.Tensor,
                        mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimates ``[B, T]`` weighted by the sequence importance ratio
    rho_i = pi_theta(y_i) / pi_old(y_i) = exp(sum_t m_t (logp - behaviour_logp)), differentiable
    through rho. For samples drawn from a stale policy pi_old, E_old[grad (rho * sum_t k3_t)] is the
    exact gradient of the sequence-level reverse KL (P5, "rho * k3"; checked by ``harnessrl
    kl-check``, row k3/loss/stale-is). rho is not clipped: bound the staleness instead. Masked
    positions (``mask`` 0) are ignored whatever they hold.
    """
    log_rho = masked(logp - behaviour_logp.detach(), mask).sum(-1, keepdim=True)
    return masked(per_token, mask) * torch.exp(log_rho.clamp(max=LOG_RATIO_CLAMP))


def _placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"train.kl.placement={placement!r} is not one of {PLACEMENTS}")
    return placement


def kl_in_reward(beta: float, placement: str) -> bool:
    """Whether the KL term is subtracted from the reward: ``beta > 0`` and placement ``reward`` or
    ``both``. Raises ValueError for a placement not in :data:`PLACEMENTS`."""
    return _placement(placement) in ("reward", "both") and beta > 0


def kl_in_loss(beta: float, placement: str) -> bool:
    """Whether the KL term is added to the loss: ``beta > 0`` and placement ``loss`` or ``both``.
    Raises ValueError for a placement not in :data:`PLACEMENTS`."""
    return _placement(placement) in ("loss", "both") and beta > 0


def kl_penalized_rewards(rewards: torch.Tensor, logp: Sequence[torch.Tensor], ref_logp: Sequence[torch.Tensor],
                         masks: Sequence[torch.Tensor], kind: str, beta: float
                         ) -> tuple[torch.Tensor, float]:
    """KL in the reward (P5): r'_i = r_i - beta * sum_t k_t(theta, ref), one penalty per sequence.

    Args:
        rewards: ``[N]`` float64 rewards.
        logp, ref_logp, masks: N per-token tensors each (``[T_i]``, float32): the current policy's
            log-probs of the sampled tokens (detached: the penalty carries no gradient), the
            reference's, and the policy-token mask (1 = counted).
        kind: the estimator (:func:`kl_estimate`); ``beta``: the coefficient.

    Returns:
        ``(r', mean penalty)``: ``[N]`` float64 penalized rewards and the mean of beta * sum_t k_t
        over the N sequences (a float).

    Raises:
        ValueError: as :func:`kl_estimate`.
    """
    pen = torch.zeros(len(logp), dtype=torch.float64)
    for r, (lp, ref, m) in enumerate(zip(logp, ref_logp, masks)):
        pen[r] = float(kl_estimate(lp, ref, kind, mask=m).sum())
    return rewards - beta * pen, float(beta * pen.mean())


def kl_loss_term(k: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, *, beta: float,
                 weighted: bool, agg: str, max_len: int | None, num_tokens: float, num_seqs: float) -> torch.Tensor:
    """KL in the loss (P5): beta * agg(k), added to the policy loss, differentiable through ``k``
    (and through rho with ``weighted``: :func:`importance_weighted` against ``old_logp``).

    Args:
        k: ``[B, T]`` per-token estimates (:func:`kl_estimate` of ``logp`` against the reference).
        logp, old_logp, mask: ``[B, T]`` current and old log-probs and the policy-token mask.
        agg, max_len, num_tokens, num_seqs: the policy loss's aggregation
            (:func:`tasks.train.losses.agg_loss`), so both terms share one denominator.

    Returns: a scalar tensor.
    """
    k_loss = importance_weighted(k, logp, old_logp, mask) if weighted else k
    return beta * agg_loss(k_loss, mask, agg, max_len=max_len, num_tokens=num_tokens, num_seqs=num_seqs)
