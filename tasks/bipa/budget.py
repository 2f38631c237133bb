"""What a sealed BiPA config plans to sample, counted before the run (for its wall-time estimate,
``benchmarks/bipa_budget.py``)."""

from __future__ import annotations

from typing import Any


def planned_work(cfg: Any) -> dict[str, int]:
    """Counts of a config with ``bipa.findings``: ``candidates`` (the seed, the pool, the placebo
    and one rewrite per optimizer seed and round: an upper bound, an empty rewrite is not scored),
    ``episodes`` (every candidate on the selection tasks, on fresh samples of them and on the test
    tasks, ``bipa.samples`` each), ``proposals`` (rewrites written) and ``batches`` (runner calls:
    the pool, one per round, fresh, test).

    Raises:
        ValueError: the config has no ``bipa.findings``.
    """
    b = cfg.bipa
    f = b.findings
    if f is None:
        raise ValueError(f"{cfg.name}: bipa.findings is not set (no sealed measurement to count)")
    proposals = len(f.rewrite_seeds) * f.rewrite_rounds
    candidates = 1 + len(f.edits) + 1 + proposals
    per = (2 * b.selection_tasks + b.test_tasks) * b.samples
    return {"candidates": candidates, "episodes": candidates * per, "proposals": proposals,
            "batches": 3 + f.rewrite_rounds}
