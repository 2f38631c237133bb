"""KL estimators: per-token estimates of the reverse KL(pi_theta || pi_ref) on samples from
pi_theta, each with what its source says of its gradient (the facts ``harnessrl kl-check``
verifies by enumeration).

With log r_t = log pi_ref(y_t) - log pi_theta(y_t) (J. Schulman, "Approximating KL divergence",
2020; P5: docs/methods/p5-kl.md):

- k1 = -log r_t                      unbiased value, high variance
- k2 = 0.5 * (log r_t)^2             biased value, low variance
- k3 = (r_t - 1) - log r_t           unbiased value, low variance, >= 0

Which placement of which estimator gives an unbiased gradient of the sequence-level KL is P5's
table (Shah et al., arXiv 2512.21852), the ``unbiased`` claims below.

To add one: ``KL_ESTIMATORS.register(KLEstimator("k_mine", fn, unbiased={...}))`` before the
config is validated; the config (``train.kl.estimator``), the trainer, the ``kl_check``
contract and ``harnessrl kl-check`` then accept it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

from tasks.registries.registry import Registry

if TYPE_CHECKING:
    import torch

#: where the KL term goes (``train.kl.placement``): subtracted from the reward, added to the loss, both
PLACEMENTS = ("reward", "loss", "both")
#: how the samples were drawn, as the last part of a ``kl-check`` configuration name: from an older
#: policy (``stale``), and importance-weighted by pi_theta(y) / pi_old(y) (``stale-is``)
STALE_SAMPLINGS = ("stale", "stale-is")

# exp(20) ~ 4.9e8: beyond this the k3 estimate is meaningless; clamping keeps it finite (verl does the same).
LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class KLEstimator:
    """One KL estimator.

    Attributes:
        name: the value of ``train.kl.estimator`` (no ``/``).
        per_token: ``log r`` (any shape, float, log pi_ref - log pi_theta of the sampled tokens,
            differentiable) -> the per-token estimate, same shape, in nats.
        unbiased: what the estimator's source says of its gradient, per configuration
            ``"<placement>"`` (on-policy samples) or ``"<placement>/<stale|stale-is>"``: True =
            an unbiased gradient of the sequence-level reverse KL. ``harnessrl kl-check``
            computes each by enumeration and compares.
        summary: one line on its value (bias, variance).

    Raises:
        ValueError: a claim's configuration is not a placement with an optional stale sampling.
    """

    name: str
    per_token: Callable[["torch.Tensor"], "torch.Tensor"]
    unbiased: Mapping[str, bool] = field(default_factory=dict)
    summary: str = ""

    def __post_init__(self) -> None:
        for conf in self.unbiased:
            placement, _, sampling = conf.partition("/")
            if placement not in PLACEMENTS or (sampling and sampling not in STALE_SAMPLINGS):
                raise ValueError(f"KL estimator {self.name!r}: claim {conf!r} is not "
                                 f"'<{'|'.join(PLACEMENTS)}>[/{'|/'.join(STALE_SAMPLINGS)}]'")


def _k1(log_r: "torch.Tensor") -> "torch.Tensor":
    return -log_r


def _k2(log_r: "torch.Tensor") -> "torch.Tensor":
    return 0.5 * log_r.square()


def _k3(log_r: "torch.Tensor") -> "torch.Tensor":
    log_r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_r.expm1() - log_r


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", "train.kl.estimator")
KL_ESTIMATORS.register(KLEstimator("k1", _k1, summary="unbiased value, high variance", unbiased={
    "reward": True, "loss": False, "both": True, "reward/stale": False, "reward/stale-is": True}))
KL_ESTIMATORS.register(KLEstimator("k2", _k2, summary="biased value, low variance", unbiased={
    "reward": False, "loss": False, "both": False}))
KL_ESTIMATORS.register(KLEstimator("k3", _k3, summary="unbiased value, low variance, >= 0", unbiased={
    "reward": False, "loss": False, "both": True, "loss/stale": False, "loss/stale-is": True}))
