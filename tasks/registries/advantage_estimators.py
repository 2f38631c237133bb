"""Advantage estimators (``train.advantage_scale``): one group's rewards -> its samples' advantages,
shared by every token of a sample (:func:`tasks.train.advantages.group_advantages` groups the
samples and calls them).

- ``std``: A_i = (r_i - mean_g(r)) / (std_g(r) + eps), std Bessel-corrected as in verl and TRL
  (GRPO, DeepSeekMath, arXiv 2402.03300, sec. 4.1.2);
- ``none``: A_i = r_i - mean_g(r) (Dr. GRPO, arXiv 2503.20783).

A group with one sample, or whose rewards are all equal, gets exactly 0 whatever the estimator
(``group_advantages`` does not call it).

To add one: ``ADVANTAGE_ESTIMATORS.register(AdvantageEstimator("mine", fn, source="..."))``; the
config (``train.advantage_scale``), the trainer and the analyses then accept it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tasks.registries.registry import Registry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AdvantageEstimator:
    """One advantage estimator.

    Attributes:
        name: the value of ``train.advantage_scale``.
        advantages: ``(rewards, eps) -> advantages``: a group's float64 ``[n]`` rewards (n >= 2,
            not all equal) and the config's epsilon -> float64 ``[n]``.
        source: where it comes from (``"GRPO"``).
    """

    name: str
    advantages: Callable[["torch.Tensor", float], "torch.Tensor"]
    source: str = ""


def _std(rg: "torch.Tensor", eps: float) -> "torch.Tensor":
    return (rg - rg.mean()) / (rg.std(unbiased=True) + eps)


def _none(rg: "torch.Tensor", eps: float) -> "torch.Tensor":
    return rg - rg.mean()


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "train.advantage_scale")
ADVANTAGE_ESTIMATORS.register(AdvantageEstimator("std", _std, source="GRPO"))
ADVANTAGE_ESTIMATORS.register(AdvantageEstimator("none", _none, source="Dr. GRPO"))
