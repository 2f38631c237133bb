"""Sampling groups: which episodes are compared with one another.

The rollout stage stamps every episode with its group (``episodes.group_id``) and the trainer
groups sequences for advantages (:mod:`tasks.train.advantages`) by the same rule, so the rule lives
here, below both. Within / Cross grouping: docs/methods/p4-within-cross.md (Le et al., arXiv 2609.04518).
"""

from __future__ import annotations

from typing import Literal, Sequence

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
