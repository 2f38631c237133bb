"""Which sequences go into which optimizer step: groups under a grouping rule, mini-batches of
whole groups shuffled per epoch, and the tasks each online iteration samples.

Pure functions of their inputs and a seed (docs/methods/index.md, "Common ground", and
docs/methods/p4-within-cross.md); no model here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tasks.hashing import seed_from
from tasks.rollout.groups import group_ids
from tasks.train.advantages import coverage_matched_mask, group_advantages, residualized_rewards


@dataclass
class GroupPlan:
    """The groups of a batch of sequences under one grouping rule (:func:`plan_groups`).

    Attributes:
        group_ids: one group label per sequence (``task|harness`` or ``task``).
        groups: sequence indices of each group, groups in order of first appearance.
        offsets: float64 ``[N]`` subtracted from each reward before normalising (residualized
            Cross's leave-one-task-out per-harness baseline; 0 otherwise).
        keep: bool ``[N]``: samples whose advantage counts (coverage-matched Cross drops some).
        scale: the advantage estimator (:data:`tasks.registries.ADVANTAGE_ESTIMATORS`: ``std``
            for GRPO, ``none`` for Dr. GRPO, ...).
    """

    group_ids: list[str]
    groups: list[list[int]]
    offsets: torch.Tensor
    keep: torch.Tensor
    scale: str

    def advantages(self, rewards: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
        """Float32 ``[len(idx)]`` advantages of the sequences ``idx`` (whole groups) given their
        rewards ``[len(idx)]``; equal to normalising over the full batch because every group is
        complete in ``idx``."""
        idx = list(idx)
        r = torch.as_tensor(rewards, dtype=torch.float64) - self.offsets[idx]
        adv = group_advantages(r, [self.group_ids[i] for i in idx], scale=self.scale)
        return adv * self.keep[idx].to(adv.dtype)


def plan_groups(rewards: Sequence[float], task_ids: Sequence[str], harness_ids: Sequence[str], grouping: str, *,
                scale: str = "std", seed: int = 0) -> GroupPlan:
    """Groups, reward offsets and keep-mask of a batch under one of P4's grouping rules
    (``within``, ``cross``, ``cross_coverage_matched``, ``cross_residualized``; see
    :func:`tasks.train.advantages.advantages_for`, which this reproduces exactly on the full
    batch). The baselines and the coverage mask are computed once from the task ``rewards`` of
    the whole batch and stay fixed while its mini-batches train.

    Raises:
        ValueError: unknown ``grouping`` or inputs of different lengths.
    """
    if grouping not in ("within", "cross", "cross_coverage_matched", "cross_residualized"):
        raise ValueError(f"grouping {grouping!r} is not one of within, cross, cross_coverage_matched, "
                         "cross_residualized")
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    gids = group_ids(task_ids, harness_ids, "within" if grouping == "within" else "cross")
    offsets = torch.zeros_like(r)
    keep = torch.ones(r.numel(), dtype=torch.bool)
    if grouping == "cross_residualized":
        offsets = r - residualized_rewards(r, task_ids, harness_ids)
    elif grouping == "cross_coverage_matched":
        cross = group_advantages(r, gids, scale=scale)
        within = group_advantages(r, group_ids(task_ids, harness_ids, "within"), scale=scale)
        keep = coverage_matched_mask(within, cross, gids, seed=seed)
    index: dict[str, list[int]] = {}
    for i, g in enumerate(gids):
        index.setdefault(g, []).append(i)
    return GroupPlan(group_ids=gids, groups=list(index.values()), offsets=offsets, keep=keep, scale=scale)


def minibatches(groups: Sequence[Sequence[int]], batch_size: int | None, seed: int) -> list[list[int]]:
    """The mini-batches of one pass: the groups in a seeded random order, ``batch_size`` whole
    groups per mini-batch (the last may hold fewer; None: one mini-batch of every group).
    Returns lists of sequence indices; ``ceil(len(groups) / batch_size)`` of them."""
    order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed)).tolist()
    b = batch_size or max(len(groups), 1)
    return [[i for g in order[j:j + b] for i in groups[g]] for j in range(0, len(order), b)]


def tasks_for_iteration(task_ids: Sequence[str], per_step: int | None, iteration: int, seed: int) -> list[str]:
    """The tasks online iteration ``iteration`` (0-based) samples: passes over ``task_ids`` in
    seeded random orders, ``per_step`` tasks per iteration, without replacement within a pass;
    when a pass ends mid-iteration the next pass starts with tasks not yet in this iteration, so
    no task appears twice in one iteration (None or >= the number of tasks: every task, every
    iteration). A pure function of its arguments (a resumed run samples the same tasks).

    Raises:
        ValueError: no tasks.
    """
    tasks = sorted(set(task_ids))
    if not tasks:
        raise ValueError("online training: no train tasks to sample")
    if per_step is None or per_step >= len(tasks):
        return tasks
    stream: list[str] = []
    n_pass = 0
    need = (iteration + 1) * per_step
    while len(stream) < need:
        perm = [tasks[i] for i in torch.randperm(len(tasks), generator=torch.Generator().manual_seed(
            seed_from(seed, "prompts", n_pass))).tolist()]
        cut = len(stream) - len(stream) % per_step  # start of the iteration this pass continues
        taken = set(stream[cut:])
        stream += [t for t in perm if t not in taken] + [t for t in perm if t in taken]
        n_pass += 1
    return stream[iteration * per_step: need]
