"""What ``harnessrl run`` prints at the end, beside the stage table: the config to run next and
one sentence that reads the pre-registered contrasts (the intervals themselves are
:func:`tasks.evaluate.stats.pass_at_1_intervals` and the ``eval_contrasts`` artifact).

A newcomer's first run should say what its numbers mean: which differences the sealed evaluation
can tell from noise at its number of test tasks, and which it cannot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# what to run after a config, for the configs a newcomer meets first (by config name)
NEXT_CONFIG = {
    "default": "configs/learn-arith.yaml, where online GRPO moves held-out pass@1 "
               "(.venv/bin/harnessrl run -c configs/learn-arith.yaml)",
}


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


def infra_line(counts: dict[str, dict[str, Any]]) -> str:
    """One line of the infra errors per stage (:func:`tasks.analysis.infra.infra_counts`), e.g.
    ``infra errors: rollout 161 of 640 episodes, train 0 of 0 sampled episodes, evaluate 0 of 1200
    planned attempts after retries (3 sealed rows ended in one, 3 retries)``; the evaluation's
    retries are named when any attempt hit an infra error, and a
    training arm that dropped episodes for an infra error is named with its count. Empty without
    counts."""
    from tasks.analysis.infra import UNITS

    parts = []
    for stage, c in counts.items():
        s = f"{stage} {c['infra_errors']} of {c['planned']} {UNITS[stage]}"
        if stage == "evaluate" and c.get("infra_attempts"):
            s += f" after retries ({c['infra_attempts']} sealed rows ended in one, {c['retries']} retries)"
        dropped = {arm: d["infra_error"] for arm, d in (c.get("dropped") or {}).items() if d.get("infra_error")}
        if dropped:
            s += " (arms that dropped episodes for an infra error: " \
                + ", ".join(f"{arm} {n}" for arm, n in dropped.items()) + ")"
        parts.append(s)
    return "infra errors: " + ", ".join(parts) if parts else ""


def print_summary(rd: Any, result: dict[str, Any], total: float, cfg: Any) -> None:
    """``harnessrl run``'s end: the stage table, the sealed evaluation's pass@1 with intervals, the
    pre-registered contrasts with their reading, the infra line, the next config, the run folder,
    the report and the wall time (``total`` seconds), printed with rich."""
    from rich.console import Console
    from rich.table import Table

    from schemas import ArtifactStore

    console = Console()
    t = Table(title=f"harnessrl run: {rd}")
    for col in ("stage", "state", "seconds", "artifacts"):
        t.add_column(col)
    for stage, r in result.items():
        t.add_row(stage, r["state"], f"{r['seconds']:.1f}",
                  ", ".join(f"{k}[{v.rows}]" for k, v in r["outputs"].items()))
    console.print(t)
    store = ArtifactStore(rd)
    m = store.rows(result["analyze"]["outputs"]["mismatch"])
    # compact (simple box, one line per row) so that it fits 80 columns without cutting a name
    from rich import box

    from tasks.evaluate.stats import pass_at_1_intervals

    ev = result["evaluate"]["outputs"]
    ci = pass_at_1_intervals(store.rows(ev["evaluations"]), cfg.evaluate.bootstrap_resamples, cfg.evaluate.seed)
    ks = sorted({r["ceiling_k"] for r in m})
    p = Table(title="sealed evaluation (test split)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              caption="95% CI: percentile bootstrap over test tasks")
    infra = any(r["infra_errors"] for r in m)
    for col in ("checkpoint", "harness", "pass@1", "95% CI", f"ceiling@{ks[0]}" if len(ks) == 1 else "ceiling",
                "mismatch", "graded", *(["infra"] if infra else [])):
        p.add_column(col, no_wrap=True)
    for r in m:
        ceiling = f"{r['ceiling']:.3f}" if len(ks) == 1 else f"{r['ceiling']:.3f} (pass@{r['ceiling_k']})"
        c = ci.get((r["checkpoint"], r["harness_name"]))
        p.add_row(r["checkpoint"], r["harness_name"], f"{r['pass_at_1']:.3f}",
                  f"[{c[1]:.2f}, {c[2]:.2f}]" if c else "n/a (none graded)", ceiling, f"{r['mismatch']:.3f}",
                  str(r["graded"]), *([str(r["infra_errors"])] if infra else []))
    console.print(p)
    contrasts = store.rows(ev["eval_contrasts"])
    if contrasts:
        q = Table(title=f"pre-registered contrasts (a - b, paired on tasks; Bonferroni over {len(contrasts)})",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col in ("contrast", "a - b", "interval", "tasks"):
            q.add_column(col, no_wrap=True)
        for c in contrasts:
            est = "n/a" if c["estimate"] is None else f"{c['estimate']:+.3f}"
            iv = f"n/a ({c['status']})" if c["ci_low"] is None else f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
            q.add_row(c["name"], est, iv, str(c["n_tasks"]))
        console.print(q)
        console.print(reading(contrasts), highlight=False)
    from tasks.analysis.infra import infra_counts, online_arm_names

    line = infra_line(infra_counts(store, online_arm_names(cfg)))
    if line:
        console.print(line, highlight=False)
    if cfg.name in NEXT_CONFIG:
        console.print(f"next: {NEXT_CONFIG[cfg.name]}", highlight=False)
    console.print(f"run folder: {rd.resolve() if isinstance(rd, Path) else rd}")
    console.print(f"report:     {(rd / 'analyze' / 'report.md').resolve() if isinstance(rd, Path) else f'{rd}/analyze/report.md'}")
    console.print(f"total:      {total:.1f} s")
