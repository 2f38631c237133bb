"""What ``harnessrl run`` prints at the end, beside the stage table: pass@1 per (checkpoint,
harness) with an interval, the pre-registered contrasts, and one sentence that reads them.

A newcomer's first run should say what its numbers mean: which differences the sealed evaluation
can tell from noise at its number of test tasks, and which it cannot.
"""

from __future__ import annotations

from typing import Any

# what to run after a config, for the configs a newcomer meets first (by config name)
NEXT_CONFIG = {
    "default": "configs/learn-arith.yaml, where online GRPO moves held-out pass@1 "
               "(.venv/bin/harnessrl run -c configs/learn-arith.yaml)",
}


def pass_at_1_intervals(rows: list[dict[str, Any]], resamples: int, seed: int, level: float = 0.95
                        ) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    """Per (checkpoint, harness): ``(pass@1, ci_low, ci_high, n_tasks)`` over the sealed rows'
    final graded attempts, pass@1 being the mean over tasks of each task's solved share (as
    :func:`tasks.evaluate.stats.cell_table` computes it) and the interval the percentile bootstrap
    over tasks at confidence ``level`` (:func:`tasks.evaluate.stats.paired_bootstrap` against 0:
    tasks resampled, each keeping its attempts). Cells without a graded attempt are left out.

    Args:
        rows: sealed ``evaluations`` rows (``checkpoint``, ``harness_name``, ``task_id``,
            ``record_id``, ``attempt``, ``status``, ``resolved``, ``retry``).
        resamples: bootstrap resamples (>= 1); ``seed``: the resampling seed (the config's).

    Raises:
        ValueError: ``resamples`` < 1 or ``level`` outside (0, 1) (from paired_bootstrap).
    """
    import numpy as np

    from tasks.evaluate.stats import GRADED, final_attempts, paired_bootstrap

    per: dict[tuple[str, str], dict[str, list[bool]]] = {}
    for r in final_attempts(rows).values():
        if r["status"] in GRADED:
            per.setdefault((r["checkpoint"], r["harness_name"]), {}).setdefault(r["task_id"], []).append(
                bool(r["resolved"]))
    out = {}
    for key in sorted(per):
        shares = np.array([sum(v) / len(v) for _, v in sorted(per[key].items())], dtype=np.float64)
        est, lo, hi, _ = paired_bootstrap(shares, np.zeros_like(shares), resamples, seed, level)
        out[key] = (est, lo, hi, len(shares))
    return out


def _what(c: dict[str, Any]) -> str:
    """A contrast in words: the harness (same checkpoint), training (same harness), or its name."""
    if c["a_checkpoint"] == c["b_checkpoint"]:
        return f"the harness ({c['a_harness']} vs {c['b_harness']}, {c['a_checkpoint']} policy)"
    if c["a_harness"] == c["b_harness"]:
        return f"training ({c['b_checkpoint']} -> {c['a_checkpoint']}, under {c['a_harness']})"
    return c["name"]


def reading(contrasts: list[dict[str, Any]]) -> str:
    """One sentence saying what the contrasts show: for each, what it compares, its estimate and
    interval, and whether the interval excludes 0 (a difference this evaluation tells apart from
    noise) or not; ``n/a`` with the reason for a contrast without an estimate. Empty without
    contrasts.

    Args:
        contrasts: ``eval_contrasts`` rows (``name``, ``a_checkpoint``, ``a_harness``,
            ``b_checkpoint``, ``b_harness``, ``estimate``, ``ci_low``, ``ci_high``, ``n_tasks``,
            ``status``).
    """
    parts = []
    for c in contrasts:
        if c.get("estimate") is None or c.get("ci_low") is None:
            parts.append(f"{_what(c)}: n/a ({c.get('status')})")
            continue
        clear = c["ci_low"] > 0 or c["ci_high"] < 0
        parts.append(f"{_what(c)} moved pass@1 by {c['estimate']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}], "
                     + ("a difference this evaluation resolves" if clear
                        else f"not resolved from noise at {c['n_tasks']} tasks"))
    if not parts:
        return ""
    ns = {c.get("n_tasks") or 0 for c in contrasts if c.get("estimate") is not None}
    head = f"On the same {ns.pop()} held-out tasks, " if len(ns) == 1 else "On the held-out tasks each compares, "
    return head + "; ".join(parts) + "."
