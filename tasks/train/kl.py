"""Per-token estimators of the reverse KL(pi_theta || pi_ref) on samples from pi_theta.

With log r_t = log pi_ref(y_t) - log pi_theta(y_t) (J. Schulman, "Approximating KL divergence",
2020; METHODS.md, P5):

- k1 = -log r_t                      unbiased value, high variance
- k2 = 0.5 * (log r_t)^2             biased value, low variance
- k3 = (r_t - 1) - log r_t           unbiased value, low variance, >= 0

Which placement of which estimator gives an unbiased gradient of the sequence-level KL is P5's
table (Shah et al., arXiv 2512.21852); ``harnessrl kl-check`` verifies it by enumeration.
"""

from __future__ import annotations

from typing import Literal

import torch

from tasks.train.losses import masked

# exp(20) ~ 4.9e8: beyond this the k3 estimate is meaningless; clamping keeps it finite (verl does the same).
LOG_RATIO_CLAMP = 20.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: Literal["k1", "k2", "k3"], *,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate, same shape as ``logp`` (e.g. ``[B, T]``), in nats.

    Args:
        logp: log pi_theta of the sampled tokens (differentiable if the gradient is wanted).
        ref_logp: log pi_ref of the same tokens.
        kind: ``k1``, ``k2`` or ``k3``.
        mask: optional ``[B, T]`` (1 = policy token): the estimate is exactly 0 where it is 0,
            with zero gradient, whatever ``logp`` and ``ref_logp`` hold there (inf and NaN too).

    Raises:
        ValueError: unknown ``kind`` or shapes differ.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp shape {tuple(logp.shape)} != ref_logp shape {tuple(ref_logp.shape)}")
    if mask is not None:
        return masked(kl_estimate(masked(logp, mask), masked(ref_logp, mask), kind), mask)
    log_r = ref_logp - logp
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    if kind == "k3":
        log_r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.expm1(log_r) - log_r
    raise ValueError(f"KL estimator {kind!r} is not one of 'k1', 'k2', 'k3'")


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
