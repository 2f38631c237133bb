"""Group-relative advantages and the grouping rules of multi-harness RL.

Each group's advantages come from an estimator of :data:`tasks.registries.ADVANTAGE_ESTIMATORS`
(``train.advantage_scale``): GRPO's (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2)
A_i = (r_i - mean(r_g)) / (std(r_g) + eps), shared by every token of sample i, or Dr. GRPO's
(arXiv 2503.20783), which drops the std division (``scale="none"``). Within / Cross grouping:
docs/methods/p4-within-cross.md (Le et al., arXiv 2609.04518).
"""

from __future__ import annotations

from typing import Sequence

import torch

from tasks.registries import ADVANTAGE_ESTIMATORS
from tasks.rollout.groups import group_ids


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[str],
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-normalised advantages, float32 tensor ``[N]``.

    Each group's by the estimator ``scale`` of :data:`tasks.registries.ADVANTAGE_ESTIMATORS`:
    A_i = r_i - mean_g(r) (``scale="none"``, Dr. GRPO) or (r_i - mean_g(r)) / (std_g(r) + eps)
    (``scale="std"``, GRPO), where std is the sample standard deviation (Bessel-corrected, as in
    verl and TRL). A group whose rewards are all equal, or that has one sample, gets exactly 0
    (never NaN), whatever the estimator.

    Args:
        rewards: ``[N]`` float rewards (any scale).
        group_ids: ``N`` group labels (see :func:`tasks.rollout.groups.group_ids`).

    Raises:
        ValueError: lengths differ, unknown ``scale``, or a non-finite reward.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if r.numel() != len(group_ids):
        raise ValueError(f"rewards has {r.numel()} entries but group_ids has {len(group_ids)}")
    estimator = ADVANTAGE_ESTIMATORS.get(scale)
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
        adv[idx] = estimator.advantages(rg, eps)
    return adv.to(torch.float32)


def zero_signal_fraction(advantages: torch.Tensor, group_ids: Sequence[str]) -> float:
    """Fraction of groups whose advantages are all exactly zero (no learning signal)."""
    groups: dict[str, bool] = {}
    a = advantages.detach().flatten().tolist()
    for v, g in zip(a, group_ids):
        groups[g] = groups.get(g, True) and v == 0.0
    return sum(groups.values()) / max(len(groups), 1)


def residualized_rewards(rewards: torch.Tensor | Sequence[float], task_ids: Sequence[str],
                         harness_ids: Sequence[str]) -> torch.Tensor:
    """P4's residualized Cross (docs/methods/p4-within-cross.md): subtract from each reward a leave-one-task-out
    per-harness baseline, b_{h,-x} = mean reward of harness h over every *other* task, so that a
    harness's overall success rate no longer leaks into the pooled per-task advantage.

    Returns float64 ``[N]``. A harness seen on only one task has no leave-one-out baseline; its
    rewards are left as they are (baseline 0).

    Raises:
        ValueError: lengths differ.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if not (r.numel() == len(task_ids) == len(harness_ids)):
        raise ValueError(f"rewards ({r.numel()}), task_ids ({len(task_ids)}) and harness_ids ({len(harness_ids)}) differ")
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    h_sum: dict[str, float] = {}
    h_cnt: dict[str, int] = {}
    for v, t, h in zip(r.tolist(), task_ids, harness_ids):
        sums[(h, t)] = sums.get((h, t), 0.0) + v
        counts[(h, t)] = counts.get((h, t), 0) + 1
        h_sum[h] = h_sum.get(h, 0.0) + v
        h_cnt[h] = h_cnt.get(h, 0) + 1
    out = r.clone()
    for i, (t, h) in enumerate(zip(task_ids, harness_ids)):
        n_other = h_cnt[h] - counts[(h, t)]
        if n_other > 0:
            out[i] = r[i] - (h_sum[h] - sums[(h, t)]) / n_other
    return out


def coverage_matched_mask(within_adv: torch.Tensor, cross_adv: torch.Tensor, cross_groups: Sequence[str], *,
                          seed: int) -> torch.Tensor:
    """P4's coverage-matched Cross (docs/methods/p4-within-cross.md; Le et al., arXiv 2609.04518): Cross grouping kept
    on a subset of whole Cross groups whose non-zero-advantage samples number as many as Within
    has, so both rules train on the same amount of signal.

    Rule (our reconstruction, [design]): the Cross groups (tasks) with at least one non-zero
    advantage are visited in a seeded random order (``torch.randperm`` with
    ``torch.Generator().manual_seed(seed)`` over the groups sorted by id); a group is kept, with
    ALL its samples, when its non-zero count still fits under the target ``n_within`` = the number
    of non-zero Within advantages (first fit); the others are dropped whole. So

    - every group's advantages still sum to 0 (a kept group is a full GRPO group, centred on its
      own mean; a dropped group is all 0), which subsampling single samples breaks;
    - kept non-zero samples <= ``n_within``, and a group is skipped only when it would overshoot
      (so the shortfall is smaller than the smallest non-zero group left out);
    - if Cross has no more non-zero samples than Within, every group is kept.

    Args:
        within_adv, cross_adv: float ``[N]`` advantages of the same samples under Within and Cross.
        cross_groups: ``N`` Cross group ids (:func:`tasks.rollout.groups.group_ids` with ``mode="cross"``).
        seed: the order of the groups.

    Returns:
        bool ``[N]`` keep-mask (constant within each Cross group).

    Raises:
        ValueError: the three inputs differ in length.
    """
    n = cross_adv.numel()
    if within_adv.numel() != n or len(cross_groups) != n:
        raise ValueError(f"within_adv ({within_adv.numel()}), cross_adv ({n}) and cross_groups ({len(cross_groups)}) "
                         "differ in length")
    n_within = int((within_adv != 0).sum())
    nonzero = (cross_adv != 0).tolist()
    members: dict[str, list[int]] = {}
    for i, g in enumerate(cross_groups):
        members.setdefault(g, []).append(i)
    live = sorted(g for g, idx in members.items() if any(nonzero[i] for i in idx))
    keep = torch.zeros(n, dtype=torch.bool)
    if sum(nonzero) <= n_within:
        keep[:] = True
        return keep
    order = torch.randperm(len(live), generator=torch.Generator().manual_seed(seed)).tolist()
    kept = 0
    for j in order:
        idx = members[live[j]]
        size = sum(nonzero[i] for i in idx)
        if kept + size <= n_within:
            keep[idx] = True
            kept += size
    return keep


GROUPINGS = ("within", "cross", "cross_coverage_matched", "cross_residualized")


def advantages_for(rewards: torch.Tensor | Sequence[float], task_ids: Sequence[str], harness_ids: Sequence[str],
                   grouping: str, *, scale: str = "std", seed: int = 0,
                   eps: float = 1e-6) -> tuple[torch.Tensor, list[str]]:
    """Advantages ``[N]`` (float32) and the group ids under one of P4's grouping rules:

    - ``within``: one group per (task, harness);
    - ``cross``: harnesses pooled per task;
    - ``cross_coverage_matched``: Cross on a seeded subset of whole Cross groups holding at most Within's
      number of non-zero-advantage samples (:func:`coverage_matched_mask`; every group still sums to 0);
    - ``cross_residualized``: Cross over rewards minus a leave-one-task-out per-harness baseline.

    Raises:
        ValueError: unknown ``grouping`` (the message lists the rules) or bad inputs.
    """
    if grouping == "within":
        g = group_ids(task_ids, harness_ids, "within")
        return group_advantages(rewards, g, scale=scale, eps=eps), g
    g = group_ids(task_ids, harness_ids, "cross")
    if grouping == "cross":
        return group_advantages(rewards, g, scale=scale, eps=eps), g
    if grouping == "cross_residualized":
        return group_advantages(residualized_rewards(rewards, task_ids, harness_ids), g, scale=scale, eps=eps), g
    if grouping == "cross_coverage_matched":
        cross = group_advantages(rewards, g, scale=scale, eps=eps)
        within = group_advantages(rewards, group_ids(task_ids, harness_ids, "within"), scale=scale, eps=eps)
        return cross * coverage_matched_mask(within, cross, g, seed=seed), g
    raise ValueError(f"grouping {grouping!r} is not one of {GROUPINGS}")


REWARD_CONTROLS = ("none", "shuffle", "bernoulli")


def control_rewards(rewards: torch.Tensor | Sequence[float], control: str, seed: int) -> torch.Tensor:
    """The rewards a random-reward control trains on: the same batch, with the information taken out.

    - ``none``: the rewards unchanged (a copy, float64 ``[N]``);
    - ``shuffle``: a seeded permutation of the batch's rewards across all its samples, so the
      batch's mean and spread stay but no reward belongs to its sample any more;
    - ``bernoulli``: each sample 1.0 with probability mean(rewards), else 0.0 (a success drawn at
      the batch's success rate, independently of what the sample did).

    A learning claim stands only against such a control (the same pipeline, the same number of
    updates with non-zero advantages on average), because GRPO on rewards that carry no
    information can still move pass@1 through the updates themselves (format drift, entropy
    collapse). ``rewards``: float ``[N]``; ``seed``: the control's seed (one per batch). Returns
    float64 ``[N]``.

    Raises:
        ValueError: unknown ``control`` (the message lists :data:`REWARD_CONTROLS`).
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).clone()
    if control == "none":
        return r
    g = torch.Generator().manual_seed(seed)
    if control == "shuffle":
        return r[torch.randperm(len(r), generator=g)]
    if control == "bernoulli":
        p = float(r.mean()) if len(r) else 0.0
        return (torch.rand(len(r), generator=g, dtype=torch.float64) < p).to(torch.float64)
    raise ValueError(f"train.reward_control={control!r} is not one of {REWARD_CONTROLS}")
