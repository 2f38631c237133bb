"""Group-relative advantages and the grouping rules of multi-harness RL.

GRPO (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2): A_i = (r_i - mean(r_g)) / (std(r_g) + eps),
shared by every token of sample i. Dr. GRPO (arXiv 2503.20783) drops the std division
(``scale="none"``). Within / Cross grouping: METHODS.md, P4 (Le et al., arXiv 2609.04518).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

GROUP_SEP = "|"


def group_ids(task_ids: Sequence[str], harness_ids: Sequence[str], mode: Literal["within", "cross"]) -> list[str]:
    """Group id of each sample, computed from content, never from row order.

    ``within``: one group per (task, harness) -> ``"task|harness"``.
    ``cross``: harnesses pooled per task -> ``"task"``.

    Raises:
        ValueError: unknown ``mode``, or the two lists differ in length.
    """
    if len(task_ids) != len(harness_ids):
        raise ValueError(f"task_ids has {len(task_ids)} entries but harness_ids has {len(harness_ids)}")
    if mode == "within":
        return [f"{t}{GROUP_SEP}{h}" for t, h in zip(task_ids, harness_ids)]
    if mode == "cross":
        return [str(t) for t in task_ids]
    raise ValueError(f"grouping mode {mode!r} is not one of 'within', 'cross'")


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[str],
    *,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-normalised advantages, float32 tensor ``[N]``.

    A_i = r_i - mean_g(r) (``scale="none"``, Dr. GRPO) or (r_i - mean_g(r)) / (std_g(r) + eps)
    (``scale="std"``, GRPO), where std is the sample standard deviation (Bessel-corrected, as in
    verl and TRL). A group whose rewards are all equal, or that has one sample, gets exactly 0
    (never NaN).

    Args:
        rewards: ``[N]`` float rewards (any scale).
        group_ids: ``N`` group labels (see :func:`group_ids`).

    Raises:
        ValueError: lengths differ, unknown ``scale``, or a non-finite reward.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if r.numel() != len(group_ids):
        raise ValueError(f"rewards has {r.numel()} entries but group_ids has {len(group_ids)}")
    if scale not in ("std", "none"):
        raise ValueError(f"scale {scale!r} is not one of 'std', 'none'")
    if not torch.isfinite(r).all():
        bad = torch.nonzero(~torch.isfinite(r)).flatten().tolist()
        raise ValueError(f"non-finite rewards at indices {bad[:10]}")
    adv = torch.zeros_like(r)
    index: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        index.setdefault(g, []).append(i)
    for idx in index.values():
        if len(idx) < 2:
            continue
        rg = r[idx]
        if bool((rg == rg[0]).all()):
            continue
        centred = rg - rg.mean()
        if scale == "std":
            centred = centred / (rg.std(unbiased=True) + eps)
        adv[idx] = centred
    return adv.to(torch.float32)


def zero_signal_fraction(advantages: torch.Tensor, group_ids: Sequence[str]) -> float:
    """Fraction of groups whose advantages are all exactly zero (no learning signal)."""
    groups: dict[str, bool] = {}
    a = advantages.detach().flatten().tolist()
    for v, g in zip(a, group_ids):
        groups[g] = groups.get(g, True) and v == 0.0
    return sum(groups.values()) / max(len(groups), 1)
