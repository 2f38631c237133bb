"""The report of a sealed BiPA run (``<run>/bipa/report.md``): the pre-registered findings, the
candidates with their decisions and gains, the placebo's row first among them."""

from __future__ import annotations

from typing import Any


def _f(x: float | None, d: int = 3) -> str:
    return "n/a" if x is None else f"{x:+.{d}f}"


def findings_markdown(cfg: Any, plan: dict[str, Any], cands: list[dict[str, Any]], findings: list[dict[str, Any]],
                      gains: list[dict[str, Any]]) -> str:
    """Markdown: the plan in one paragraph, the findings table (estimate, interval, level,
    verdict, reason), the placebo's gains (the null) and every candidate's gains by set."""
    out = [f"# BiPA findings ({cfg.name})", "",
           f"Harness `{plan['harness']}`, policy `{plan['model']}`; {len(plan['selection_tasks'])} selection and "
           f"{len(plan['test_tasks'])} test task(s) x {plan['samples']} sample(s); a pool of "
           f"{len(plan['pool']) - 1} hand-written edit(s) and a placebo; rewrites under optimizer seeds "
           f"{plan['rewrite']['seeds']} for {plan['rewrite']['rounds']} round(s). Rule: accept iff candidate mean - "
           f"parent mean > {plan['accept']['better_by']} on the selection tasks. Plan `{plan_hash_of(plan)[:16]}`.", "",
           "## Findings", "", "| finding | measure | estimate | interval | level | verdict | reason |",
           "|---|---|---:|---|---:|---|---|"]
    for f in findings:
        iv = "n/a" if f["ci_low"] is None else f"[{f['ci_low']:+.3f}, {f['ci_high']:+.3f}]"
        out.append(f"| {f['name']} | {f['measure']} ({f['arm']}{', ' + f['score_set'] if f['score_set'] else ''}) | "
                   f"{_f(f['estimate'])} | {iv} | {f['level']:.4f} | {f['verdict']} | {f['reason']} |")
    out += ["", "## Candidates (gain over the parent, by set)", "",
            "| candidate | arm | parent | decision | selection | fresh | test | input tokens (test) | turns (test) |",
            "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for g in sorted(gains, key=lambda g: g["arm"] != "placebo"):
        out.append(f"| {g['name']} | {g['arm']} | {g['parent']} | {g['decision']} | {_f(g['gain_selection'])} | "
                   f"{_f(g['gain_fresh'])} | {_f(g['gain_test'])} | {_f(g['input_tokens_test'], 1)} | "
                   f"{_f(g['turns_test'], 2)} |")
    invalid = [c["name"] for c in cands if c["decision"] == "invalid"]
    if invalid:
        out += ["", f"Empty rewrites (not scored): {', '.join(invalid)}."]
    return "\n".join(out) + "\n"


def plan_hash_of(plan: dict[str, Any]) -> str:
    """The plan's hash (:func:`tasks.evaluate.seal.plan_hash`)."""
    from tasks.evaluate.seal import plan_hash

    return plan_hash(plan)
