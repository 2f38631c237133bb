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


#: the sets a candidate's gain is measured on, in the order the run scores them
GAIN_SETS = ("selection", "fresh", "test")


def gains_png(gains: list[dict[str, Any]]) -> bytes | None:
    """The winner's-curse figure of a sealed run: each scored candidate's mean gain over its
    parent (pass rate, ``bipa_gains``' ``gain_<set>``) on the selection tasks, on fresh samples of
    them and on the test tasks, one line per candidate; accepted candidates solid, rejected ones
    faint, the placebo (the null) black and dashed. A gain that shrinks from selection to fresh or
    test is what selection added. None when ``gains`` has no row with a gain.

    Args:
        gains: rows of ``bipa_gains`` (:func:`tasks.bipa.claims.gain_rows`): ``name``, ``arm``
            (``pool``, ``placebo`` or ``rewrite``), ``decision`` and ``gain_selection``,
            ``gain_fresh``, ``gain_test`` (floats in [-1, 1], or None).
    """
    from tasks.analysis.plots import figure_png  # first: it selects the Agg backend

    import matplotlib.pyplot as plt

    drawn = [g for g in gains if any(g.get(f"gain_{s}") is not None for s in GAIN_SETS)]
    if not drawn:
        return None
    colors = {"pool": "tab:blue", "rewrite": "tab:orange", "placebo": "black"}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.axhline(0.0, color="grey", lw=0.8)
    seen: set[str] = set()
    for g in sorted(drawn, key=lambda g: (g["arm"] == "placebo", g["decision"] == "accepted")):  # placebo on top
        xs = [i for i, s in enumerate(GAIN_SETS) if g.get(f"gain_{s}") is not None]
        ys = [g[f"gain_{GAIN_SETS[i]}"] for i in xs]
        accepted, placebo = g["decision"] == "accepted", g["arm"] == "placebo"
        key = f"{g['arm']} ({'accepted' if accepted else 'rejected'})"
        label = None if key in seen else key  # one legend entry per kind
        seen.add(key)
        ax.plot(xs, ys, marker="o", color=colors.get(g["arm"], "tab:green"), label=label,
                lw=2.2 if placebo else (1.6 if accepted else 0.8), ls="--" if placebo else "-",
                alpha=1.0 if (accepted or placebo) else 0.35)
    ax.set_xticks(range(len(GAIN_SETS)), list(GAIN_SETS))
    ax.set_xlim(-0.2, len(GAIN_SETS) - 0.8)
    ax.set_ylabel("gain over parent (pass rate)")
    ax.set_title("Skill candidates: gain at selection, on fresh samples, on test", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return figure_png(fig)


def plan_hash_of(plan: dict[str, Any]) -> str:
    """The plan's hash (:func:`tasks.evaluate.seal.plan_hash`)."""
    from tasks.evaluate.seal import plan_hash

    return plan_hash(plan)
