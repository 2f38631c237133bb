"""The run report: Markdown with PNG figures beside it (``analyze/report.md``, ``analyze/plots/``).

:func:`render_report` turns the analyze stage's tables into Markdown; figures are referenced by
their path relative to the report, so the report reads the same in the run folder and in a
repository viewer. The Prefect UI has no folder to resolve a relative path against: for it
:func:`inline_figures` embeds each figure as a ``data:image/png;base64`` URI (RFC 2397).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable

from tasks.analysis.arms import nonfinite_step


_FIGURE = re.compile(r"!\[([^\]]*)\]\((plots/[A-Za-z0-9_.-]+\.png)\)")


def inline_figures(markdown: str, png_of: Callable[[str], bytes | None], max_bytes: int = 1024 * 1024) -> str:
    """``markdown`` with every figure reference ``![caption](plots/<name>.png)`` replaced by the
    same image as a ``data:image/png;base64,...`` URI, so the report shows its figures where no
    file sits beside it (the Prefect UI).

    Args:
        png_of: the figure's bytes given its report-relative path, or None when it is missing.
        max_bytes: a PNG larger than this stays a reference, with a note (a browser and the
            Prefect API hold the whole artifact in memory).

    Raises:
        ValueError: a referenced file is not a PNG (the message names it).
    """
    def sub(m: re.Match[str]) -> str:
        data = png_of(m.group(2))
        if data is None:
            return f"*(figure {m.group(2)} is missing from the run folder)*"
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise ValueError(f"figure {m.group(2)} is not a PNG")
        if len(data) > max_bytes:
            return f"{m.group(0)} *(figure of {len(data)} bytes not inlined: see the run folder)*"
        return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(data).decode()})"

    return _FIGURE.sub(sub, markdown)


class Md(str):
    """A table cell already written in Markdown (e.g. ``**no**: <escaped reason>``): :func:`_table`
    leaves it as it is, where it escapes every other cell with :func:`md_cell`."""


_INLINE = re.compile(r"([\\`*_|~<&])")
_BLOCK_START = re.compile(r"^([-+>]|#{1,6}|\d{1,9}[.)])(?=\s|$)")
_RULE = re.compile(r"^(-\s*){3,}$")


def md_cell(text: str) -> str:
    """``text`` as Markdown that renders as ``text`` in a table cell or as a block of its own (the
    Prefect UI renders every string cell of a table artifact as Markdown): a backslash before
    ``\\ ` * _ | ~ < &`` wherever they are, and before a list, heading or quote marker that
    starts it (``- x``, ``1. x``, ``# x``, ``> x``, ``---``); line breaks become spaces (a table
    row is one line) and leading or trailing blanks go (an indented block is code). A number like
    ``-0.5`` or ``[0.1, 0.3]`` stays as it is."""
    out = " ".join(str(text).splitlines()).strip()
    out = _INLINE.sub(r"\\\1", out)
    if _RULE.match(out):
        return "\\" + out
    m = _BLOCK_START.match(out)
    if m:
        mark = m.group(1)
        out = (mark[:-1] + "\\" + mark[-1] if mark[0].isdigit() else "\\" + mark) + out[m.end():]
    return out


# P1's predictors as the report's tables name them
_PREDICTOR_NAMES = {"C": "C", "C_kl_soft": "C_soft", "M": "M", "M_step": "M_step", "C_minus_M": "C - M",
                    "C_minus_M_step": "C - M_step"}


def _f(x: Any, fmt: str = ".3f", why: str = "") -> str:
    """``x`` formatted; a missing number (None, NaN): ``n/a``, or :func:`na` of ``why`` when given."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return na(why) if why else "n/a"
    return format(x, fmt)


def _interval(lo: Any, hi: Any, why: str, fmt: str = ".3f") -> str:
    """``[lo, hi]``, or :func:`na` of ``why`` when either end is missing."""
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (lo, hi)):
        return na(why)
    return f"[{format(lo, fmt)}, {format(hi, fmt)}]"


# What fits the Prefect UI's artifact column in a 1400 px window (~840 px of text): a table wider
# than this estimate is split into column groups, each repeating the row labels, and a cell longer
# than LONG_CELL characters moves to a numbered note under the table (the UI does not wrap cells).
TABLE_BUDGET_PX = 800
LONG_CELL = 28


def fmt_num(x: Any, fmt: str = ".3f", why: str = "") -> str:
    """A number for a report cell (``fmt``), or :func:`na` of ``why`` where it is None: the format
    of every table of the report, for a section an application appends."""
    return _f(x, fmt, why)


def _col_px(cells: list[str]) -> float:
    return 8.5 * max(len(c) for c in cells) + 26.0


_NA_REASON = re.compile(r"^n/a \((.+)\)$", re.S)
# the notes of the report being rendered (text -> number), shared by its tables (:func:`report_notes`)
_NOTES: ContextVar[dict[str, int] | None] = ContextVar("harnessrl_report_notes", default=None)


@contextmanager
def report_notes() -> Iterator[dict[str, int]]:
    """One numbering of the table notes for every table rendered inside (the report and any
    section appended to it): a note text gets one number, printed once, under the first table
    that uses it; a later table that uses it again refers to it. Nested: the outer numbering."""
    notes = _NOTES.get()
    if notes is not None:
        yield notes
        return
    token = _NOTES.set({})
    try:
        yield _NOTES.get() or {}
    finally:
        _NOTES.reset(token)


def na(reason: str) -> str:
    """The cell of a value undefined on the data: ``n/a (<reason>)`` (:func:`_table` writes a long
    one as ``n/a [k]`` with the reason in note ``k``)."""
    return f"n/a ({reason})"


def _table(header: list[str], rows: list[list[str]], align: str | None = None, *, keep: int) -> list[str]:
    """A Markdown table (lines) readable at 1400 px: cells longer than :data:`LONG_CELL` become
    ``[n]`` with the text in a note below (an ``n/a (<reason>)`` cell: ``n/a [n]``, the reason in
    the note; inside :func:`report_notes`, a note already printed under an earlier table is
    referred to, not printed again); when the estimated width exceeds
    :data:`TABLE_BUDGET_PX` the columns after the first ``keep`` (the row's key: every column
    that tells one row from another, e.g. arm and step) are split into consecutive tables that
    each repeat the key. ``align``: one ``l``/``r`` per column. ``keep`` has no default: a
    table that names too few key columns loses its keys in the second group."""
    align = align or "l" + "r" * (len(header) - 1)
    shared = _NOTES.get()
    notes: dict[str, int] = shared if shared is not None else {}
    printed = len(notes)  # the notes numbered up to this one are under an earlier table
    used: dict[str, int] = {}

    def short(c: str) -> str:
        if len(c) <= LONG_CELL:
            return c
        m = _NA_REASON.match(c)
        text = m.group(1) if m else c
        n = used[text] = notes.setdefault(text, len(notes) + 1)
        return Md(f"n/a [{n}]" if m else f"[{n}]")

    def md(c: str) -> str:
        return c if isinstance(c, Md) else md_cell(c)

    body = [[short(c) for c in r] for r in rows]
    widths = [_col_px([h] + [r[i] for r in body]) for i, h in enumerate(header)]
    keep = min(keep, len(header))
    groups: list[list[int]] = []
    cur: list[int] = []
    base = sum(widths[:keep])
    for i in range(keep, len(header)):
        if cur and base + sum(widths[j] for j in cur) + widths[i] > TABLE_BUDGET_PX:
            groups.append(cur)
            cur = []
        cur.append(i)
    groups.append(cur)
    out: list[str] = []
    for gi, g in enumerate(groups):
        cols = list(range(keep)) + g
        sep = ["---:" if align[i] == "r" else "---" for i in cols]
        if gi:
            out.append("")
        out += ["| " + " | ".join(md(header[i]) for i in cols) + " |", "| " + " | ".join(sep) + " |"]
        out += ["| " + " | ".join(md(r[i]) for i in cols) + " |" for r in body]
    if used:
        out.append("")
        out += [f"[{n}] {md(text)}  " for text, n in sorted(used.items(), key=lambda x: x[1]) if n > printed]
        above = sorted(n for n in used.values() if n <= printed)
        if above:
            out.append(", ".join(f"[{n}]" for n in above) + ": see the note above  ")
    return out


def md_table(header: list[str], rows: list[list[str]], align: str | None = None, *, keep: int) -> list[str]:
    """:func:`_table`'s lines of a Markdown table (the report's own tables' layout and notes), for a
    section an application appends."""
    return _table(header, rows, align, keep=keep)


@dataclass
class ReportInputs:
    """Everything the report shows; each list holds the rows of the artifact of the same name
    (empty when that analysis did not run). ``figures`` maps a figure name to its path relative
    to the report; ``notes`` are lines the analyze stage adds (e.g. why an analysis was skipped)."""

    run_name: str
    config_hash: str
    model: str
    plan_hash: str
    seal_head: str
    episodes: list[dict[str, Any]]
    train_steps: list[dict[str, Any]]
    timing: list[dict[str, Any]]
    eval_cells: list[dict[str, Any]]
    eval_contrasts: list[dict[str, Any]]
    mismatch: list[dict[str, Any]]
    predictors: list[dict[str, Any]] = field(default_factory=list)
    p1_points: list[dict[str, Any]] = field(default_factory=list)
    step_mismatch: list[dict[str, Any]] = field(default_factory=list)
    log_odds: list[dict[str, Any]] = field(default_factory=list)
    leakage: list[dict[str, Any]] = field(default_factory=list)
    action_jsd: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    suite_pass_rates: list[dict[str, Any]] = field(default_factory=list)
    stability: list[dict[str, Any]] = field(default_factory=list)
    kl_check: list[dict[str, Any]] = field(default_factory=list)
    arms: list[dict[str, Any]] = field(default_factory=list)
    learning_curve: list[dict[str, Any]] = field(default_factory=list)
    step_failures: list[dict[str, Any]] = field(default_factory=list)
    infra: dict[str, dict[str, Any]] = field(default_factory=dict)


def infra_section(counts: dict[str, dict[str, Any]]) -> list[str]:
    """The report's infra-error section (Markdown lines): per stage of
    :func:`tasks.analysis.infra.infra_counts` the attempts planned, the infra errors and their
    fraction, and the retries (the evaluation's retry rows; no other stage retries), then
    per training arm the episodes dropped from its batches by rule. Empty without counts."""
    from tasks.analysis.infra import UNITS

    if not counts:
        return []
    rows = []
    for stage, c in counts.items():
        rows.append([stage, f"{c['planned']} {UNITS[stage].split()[-1]}", str(c["infra_errors"]),
                     _f(c["infra_errors"] / c["planned"]) if c["planned"] else na("none planned"),
                     str(c["retries"]) if stage == "evaluate" else "none"])
    out = ["## Infra errors", "",
           "Attempts the infrastructure lost (a sandbox that did not start, an exec server that died). A rollout "
           "or online-training episode lost so is never retried: training drops it. An evaluation attempt is "
           "retried (`evaluate.infra_retries`); one still lost after that is out of every denominator. "
           "`harnessrl findings` refuses to publish a run above its threshold (`evaluate.max_infra_error_fraction`, "
           "default 0: any).", ""]
    out += _table(["stage", "planned", "infra errors", "fraction", "retries"], rows, "lrrrr", keep=1) + [""]
    dropped = (counts.get("train") or {}).get("dropped") or {}
    if dropped:
        rows = [[arm, str(d.get("infra_error", 0)),
                 ", ".join(f"{k} {v}" for k, v in d.items() if k != "infra_error") or "none"]
                for arm, d in dropped.items()]
        out += ["Episodes dropped from each training arm's batches (a frozen arm's one pass over the rollouts; "
                "an online arm's iterations summed):", ""]
        out += _table(["arm", "infra_error", "other rules"], rows, "lrl", keep=1) + [""]
    return out


def _figure(inp: ReportInputs, name: str, caption: str) -> list[str]:
    return [f"![{caption}]({inp.figures[name]})", ""] if name in inp.figures else []


def render_report(inp: ReportInputs) -> str:
    """The report as Markdown (a ``str``; sections appear only for the analyses that ran). Its
    tables number their notes as one (:func:`report_notes`; a section appended to the report is
    rendered inside the same ``with report_notes()`` to continue the numbering)."""
    with report_notes():
        return _render(inp)


def _render(inp: ReportInputs) -> str:
    out = [f"# harnessrl run `{inp.run_name}`", "", f"config hash `{inp.config_hash[:16]}`, model `{inp.model}`", ""]
    out += infra_section(inp.infra)
    eps = inp.episodes
    out += ["## Training rollouts (base policy)", ""]
    rows = []
    for h in sorted({e["harness_name"] for e in eps}):
        es = [e for e in eps if e["harness_name"] == h]
        parsed = [e for e in es if e["answer_parsed"]]
        rows.append([h, str(len(es)), _f(sum(e["reward"] for e in es) / len(es)),
                     _f(sum(e["success"] for e in es) / len(es)), _f(len(parsed) / len(es)),
                     _f(sum(e["success"] for e in parsed) / len(parsed)) if parsed else na("no answer parsed"),
                     _f(sum(e["num_turns"] for e in es) / len(es), ".2f")])
    out += _table(["harness", "episodes", "mean reward", "pass@1", "parse rate", "accuracy given parsed",
                   "mean turns"], rows, keep=1) + [""]

    out += ["## Training", ""]
    tps = {(t.get("arm") or "final", t["step"]): t.get("tokens_per_s") for t in inp.timing}
    rows = []
    for s in inp.train_steps:
        arm = s.get("arm") or "final"
        nc = "not computed at this step"
        rows.append([arm, str(s["step"]), _f(s["reward_mean"], why=nc), _f(s["loss"], ".4f", why=nc),
                     _f(s["kl"], ".5f", why="no KL term"), _f(s["entropy"], why=nc), _f(s["clip_frac"], why=nc),
                     _f(s["zero_adv_frac"], why=nc), _f(s["grad_norm"], why=nc),
                     _f(tps.get((arm, s["step"])), ".0f", why="not timed")])
    out += _table(["arm", "step", "reward", "loss", "KL", "entropy", "clip frac", "zero-adv frac", "grad norm",
                   "tokens/s"], rows, "lr" + "r" * 8, keep=2) + [""]
    bad = [s for s in inp.train_steps if nonfinite_step(s)]
    if bad:
        out += [f"**Unstable:** non-finite loss, KL or gradient norm at {len(bad)} step(s): "
                + ", ".join(f"{s.get('arm') or 'final'} step {s['step']}" for s in bad[:10]), ""]
    out += _figure(inp, "learning_curves", "learning curves")
    if inp.stability:
        spec = {a["arm"]: a for a in inp.arms}
        rows = []
        for r in inp.stability:
            a = spec.get(r["arm"], {})
            kl = f"{a['estimator']} in {a['placement']}, beta {a['beta']:g}" if a.get("estimator") else "none"
            regime = (f"{a['mode']}" + (f", staleness <= {a['max_staleness']}" if a.get("max_staleness") else "")
                      if a else "")
            rows.append([r["arm"], a.get("algorithm") or na("no arm spec"), kl, regime or na("no arm spec"),
                         str(r["steps"]), _f(r["first_reward"], why="no step"),
                         _f(r["final_reward"], why="no step"), _f(r["final_kl"], ".5f", why="no KL term"),
                         _f(r["max_kl"], ".5f", why="no KL term"),
                         "yes" if r["stable"] else Md(f"**no**: {md_cell(r['reason'])}")])
        out += ["Training arms (stable: every loss and gradient norm finite, KL finite where computed (n/a: no KL "
                "term) and below the divergence threshold):",
                ""]
        out += _table(["arm", "objective", "KL", "sampling", "steps", "first reward", "last reward", "last KL",
                       "max KL", "stable"], rows, "llllrrrrrl", keep=1) + [""]

    out += ["## Sealed evaluation", "", f"plan `{inp.plan_hash[:16]}`, chain head `{inp.seal_head[:16]}` "
            "(`harnessrl verify` recomputes both). pass@1 per checkpoint (rows) and evaluation harness (columns); "
            "a held-out harness was never used in training; `n/c`: the cell's graded coverage is below the rule.", ""]
    cells = [c for c in inp.eval_cells if c["kind"] == "cell"]
    if cells:
        hs = list(dict.fromkeys(c["harness_name"] for c in cells))
        held = {c["harness_name"] for c in cells if c["held_out"]}
        val = {(c["checkpoint"], c["harness_name"]): c for c in cells}
        rows = []
        for ck in dict.fromkeys(c["checkpoint"] for c in cells):
            rows.append([ck] + [("n/c" if not val[(ck, h)]["counted"] else _f(val[(ck, h)]["pass_at_1"]))
                                if (ck, h) in val else na("not in the plan") for h in hs])
        out += _table(["checkpoint"] + [f"{h} (held out)" if h in held else h for h in hs], rows, keep=1) + [""]
        out += ["Format apart from competence: the parse rate is the share of graded attempts whose answer was "
                "in the harness's own format (its answer pattern or submit tool, not the last-number fallback); "
                "accuracy given parsed is pass@1 among those (n/a: none parsed). A gain in the parse rate is the "
                "policy learning the harness (P1's mismatch going down); a gain in accuracy given parsed is the "
                "policy learning the task.", ""]
        rows = [[c["checkpoint"], c["harness_name"], _f(c["pass_at_1"]), _f(c["parse_rate"], why="none graded"),
                 _f(c["acc_given_parsed"], why="no answer parsed")] for c in cells if c["counted"]]
        out += _table(["checkpoint", "harness", "pass@1", "parse rate", "accuracy given parsed"], rows, "llrrr",
                      keep=2) + [""]
    out += _figure(inp, "pass_rate_heatmap", "train x eval harness pass rates")
    if inp.learning_curve:
        out += ["Learning curve: sealed pass@1 of each arm's checkpoints against the training step (base = step "
                "0; snapshots every `train.save_every` steps), 95% task-resampling bootstrap interval, beside the "
                "mean training reward of the steps since the previous point.", ""]
        rows = [[r["arm"], r["harness_name"], str(r["step"]), _f(r["pass_at_1"], why="cell not counted"),
                 _interval(r["ci_low"], r["ci_high"], "cell not counted"),
                 _f(r["train_reward"], why="before training" if r["step"] == 0 else "no step since the previous point")]
                for r in inp.learning_curve]
        out += _table(["arm", "harness", "step", "pass@1", "95% CI", "train reward"], rows, "llrrrr", keep=3) + [""]
        out += _figure(inp, "learning_vs_step", "training reward and sealed pass@1 against step")
    if inp.suite_pass_rates:
        rows = [[r["checkpoint"], r["harness_name"], r["suite"], str(r["n_tasks"]), str(r["graded"]),
                 _f(r["pass_at_1"], why="none graded"), _interval(r["ci_low"], r["ci_high"], "none graded"),
                 _f(r["median_turns"], ".1f", why="none graded")]
                for r in inp.suite_pass_rates]
        out += ["Per suite (out-of-domain suites are test-only), with a 95% task-resampling bootstrap interval and the "
                "median agent steps (turns) per graded attempt:", ""]
        out += _table(["checkpoint", "harness", "suite", "tasks", "graded", "pass@1", "interval", "median steps"],
                      rows, "lllrrrrr", keep=3) + [""]
    if inp.eval_contrasts:
        seeded = any(c.get("interval") == "seed-task" for c in inp.eval_contrasts)
        rows = [[c["name"], f"{c['a_checkpoint']}/{c['a_harness']} - {c['b_checkpoint']}/{c['b_harness']}", c["status"],
                 str(c["n_tasks"]), *([f"{c['a_seeds']}/{c['b_seeds']}"] if seeded else []),
                 _f(c["estimate"], why=f"status {c['status']}"),
                 _interval(c["ci_low"], c["ci_high"], f"status {c['status']}"),
                 _f(c["p_bonferroni"], why=f"status {c['status']}"),
                 _f(c["mdd"], why=f"status {c['status']}" if c.get("interval") != "seed-task"
                    else "a seeded side: the paired formula has no seed term")]
                for c in inp.eval_contrasts]
        out += ["Pre-registered contrasts (task-clustered paired bootstrap, Bonferroni over the family" + (
            "; a side trained under several seeds is their mean, its interval resamples the seeds, then the tasks, "
            "and has no MDD (the paired formula has no seed term); seeds: training runs per side, 0 for the base"
            if seeded else "") + "):", ""]
        out += _table(["contrast", "a - b", "status", "tasks", *(["seeds"] if seeded else []), "estimate", "CI",
                       "p (Bonf.)", "MDD"], rows, "lllr" + ("r" if seeded else "") + "rrrr", keep=1) + [""]

    if inp.kl_check:
        by_conf = {r["configuration"]: r for r in inp.kl_check}
        final = {}
        for r in inp.suite_pass_rates:
            final.setdefault(r["checkpoint"], []).append(f"{r['suite']}: {_f(r['pass_at_1'])} "
                                                         f"[{_f(r['ci_low'])}, {_f(r['ci_high'])}]")
        stable = {r["arm"]: r["stable"] for r in inp.stability}
        rows = []
        for a in inp.arms:
            k = by_conf.get(a["kl_config"])
            absent = na("not in the kl-check table")
            rows.append([a["arm"], a["kl_config"] or "no KL", absent if k is None else ("yes" if k["unbiased"] else "no"),
                         absent if k is None else _f(k["relative_bias"]),
                         absent if k is None else ("yes" if k["agrees_with_paper"] else Md("**no**")),
                         "yes" if stable.get(a["arm"]) else "no",
                         "; ".join(final.get(a["arm"], [])) or na("no sealed evaluation of the arm")])
        out += ["## P5: estimator table beside the arms", "",
                "Gradient bias of each arm's KL configuration by exact enumeration on a tiny autoregressive policy "
                "(`harnessrl kl-check`; sequence-level reverse-KL gradient), beside the arm's stability and sealed pass@1 "
                "per suite: do the unbiased configurations also train better here?", ""]
        out += _table(["arm", "KL configuration", "unbiased", "relative bias", "agrees with paper", "stable",
                       "pass@1 per suite [95% interval]"], rows, "lllrlll", keep=1) + [""]

    out += step_failures_section(inp.step_failures)
    out += _figure(inp, "step_failures", "agent steps and failure modes")

    out += ["## P1: harness ceiling minus mismatch", ""]
    if inp.mismatch:
        k = inp.mismatch[0]["ceiling_k"]
        beta = inp.mismatch[0].get("kl_beta")
        ng, nb = "none graded", "no per-step branching"
        rows = [[r["checkpoint"], r["harness_name"], str(r["n_tasks"]), str(r["graded"]), str(r["infra_errors"]),
                 _f(r["pass_at_1"], why=ng), _f(r["ceiling"], why=ng), _f(r["mismatch"], why=ng),
                 _f(r.get("ceiling_kl_soft"), why="no reference pass rate"),
                 _f(r.get("mismatch_kl_soft"), why="no reference pass rate"), _f(r.get("mismatch_step"), why=nb),
                 _f(r.get("predicted_return"), why=nb)]
                for r in inp.mismatch]
        out += [f"C = pass@{k} ceiling (unbiased estimator); C_soft = KL-soft ceiling, per task then averaged: the mean "
                f"over tasks of p e^(1/b) / (1 - p + p e^(1/b)) with p the reference's pass rate on the task and "
                f"b = analyze.kl_beta = {_f(beta, 'g')}; M = C - pass@1; M_step = per-step mismatch by branching "
                "(n/a: not computed); C - M_step = P1's predicted return.", ""]
        out += _table(["checkpoint", "harness", "tasks", "graded", "infra", "pass@1", "C", "M", "C_soft",
                       "C_soft - pass@1", "M_step", "C - M_step"], rows, "ll" + "r" * 10, keep=2) + [""]
    out += _figure(inp, "ceiling_vs_return", "ceiling vs deployed return")
    if inp.step_mismatch:
        rows = [[r["checkpoint"], r["harness_name"], str(r["n_episodes"]), str(r["n_states"]),
                 _f(r["mean_v_star_s0"]), _f(r["mean_success"]), _f(r["m_step"]), str(r["n_complete"]),
                 " ".join(_f(m, ".2f") for m in r["m_by_turn"]), str(r["replay_divergences"])]
                for r in inp.step_mismatch]
        out += ["Per-step mismatch: K continuations branched from every visited state; m_t = V*_K(s_t) - V*_K(s_t+1), "
                "summed over the episode (telescopes to V*_K(s_0) - success).", ""]
        out += _table(["checkpoint", "harness", "episodes", "states", "V*_K(s_0)", "success", "M_step",
                       "complete episodes", "mean m_t by turn", "replay divergences"], rows, "ll" + "r" * 8, keep=2) + [""]
    if inp.p1_points:
        ref = inp.p1_points[0]["reference"]
        ng, nb = "none graded", "no per-step branching"
        rows = [[p["checkpoint"], p["harness_name"], _f(p["C"], why=ng), _f(p["C_kl_soft"], why="no reference pass rate"),
                 _f(p["M"], why=ng), _f(p["M_step"], why=nb), _f(p["C_minus_M"], why=ng),
                 _f(p["C_minus_M_step"], why=nb), _f(p["gain"], "+.3f", why=ng), _f(p["trained_return"], why=ng)]
                for p in inp.p1_points]
        out += [f"P1's claim test, one point per (trained checkpoint, harness): the predictors measured on `{ref}` (the "
                "base policy) under the harness, the targets on the checkpoint (gain = its pass@1 minus the base's). "
                "With the simple estimator C - M is the base's pass@1 by construction; C - M_step is the claim.", ""]
        out += _table(["checkpoint", "harness", "C", "C_soft", "M", "M_step", "C - M", "C - M_step", "RL gain",
                       "trained return"], rows, "ll" + "r" * 8, keep=2) + [""]
    if inp.predictors:
        rows = [[r["target"], _PREDICTOR_NAMES.get(r["predictor"], r["predictor"]), str(r["n_points"])]
                + ([na(r["na_reason"])] * 3 if r["na_reason"] else
                   [_f(r["r2"]), _interval(r["ci_low"], r["ci_high"], "no bootstrap resample had a defined R^2"),
                    _f(r["slope"])]) for r in inp.predictors]
        out += ["R^2 of each predictor of the RL gain and of the trained return over those points, with task-clustered "
                "bootstrap intervals; n/a with the reason where the statistic is undefined or degenerate (fewer than "
                "5 points, a constant predictor or target, a predictor not measured).", ""]
        out += _table(["target", "predictor", "points", "R^2", "interval", "slope"], rows, "llrrrr", keep=2) + [""]
    if inp.p1_points:
        from tasks.analysis.predictors import rank_correlations

        rows = [[r["target"], _PREDICTOR_NAMES[r["predictor"]], str(r["n_points"]),
                 _f(r["rho"], "+.3f") if not r["na_reason"] else na(r["na_reason"])]
                for r in rank_correlations(inp.p1_points)]
        out += ["Spearman's rank correlation of each predictor with the target over the same points: does the "
                "predictor order the points as the target does (R^2 above asks for a straight line)?", ""]
        out += _table(["target", "predictor", "points", "rho"], rows, "llrr", keep=2) + [""]
    out += _figure(inp, "r2_comparison", "R^2 comparison")
    if inp.log_odds:
        def why(r: dict[str, Any]) -> str:
            return "fewer than 3 pairs" if r["n_pairs"] < 3 else "one side constant"

        rows = [[r["checkpoint"], r["harness_name"], str(r["n_states"]), str(r["n_pairs"]),
                 _f(r["pearson_policy_ref"], why=why(r)), _f(r["spearman_policy_ref"], why=why(r)),
                 _f(r["pearson_shift_reward"], why=why(r)), _f(r["mean_abs_shift"], ".4f", why="no pair")]
                for r in inp.log_odds]
        out += ["Log-odds check: at first-turn states, the log-odds between the group's sampled actions under the "
                "trained policy against the reference (the harness's preferences); and the shift (policy - reference) "
                "against the reward difference (P1: shift = (Q(a) - Q(b)) / beta).", ""]
        out += _table(["checkpoint", "harness", "states", "pairs", "r (policy, ref)", "rho (policy, ref)",
                       "r (shift, reward diff)", "mean abs shift (nats)"], rows, "ll" + "r" * 6, keep=2) + [""]

    out += ["## P4: Within vs Cross grouping", ""]
    if inp.leakage:
        rows = []
        for r in inp.leakage:  # a row's note says why its values are n/a (leakage not computable)
            why = r["note"] or "not computed"
            rows.append([r["rule"], f"{r['zero_groups']}/{r['n_groups']}", _f(r["zero_group_fraction"], why=why),
                         _f(r["accuracy"], why=why), _f(r["null_mean"], why=why), _f(r["leakage_pp"], ".2f", why=why),
                         _interval(r["ci_low"], r["ci_high"], why, ".2f"), _f(r["p_value"], why=why)])
        out += ["Zero-advantage groups (no learning signal) and harness-identity leakage: cross-validated accuracy of a "
                "logistic regression predicting the harness from a sample's advantage, minus its shuffled-label null "
                "(percentage points, interval from the null's quantiles).", ""]
        out += _table(["rule", "zero groups", "fraction", "accuracy", "null", "leakage (pp)", "interval", "p"],
                      rows, "lrrrrrrr", keep=1) + [""]
    out += _figure(inp, "leakage", "zero-advantage groups and harness-identity leakage")
    if inp.action_jsd:
        rows = [[r["scope"].replace("_", " "), f"{r['checkpoint_a']} / {r['harness_a']}",
                 f"{r['checkpoint_b']} / {r['harness_b']}", _f(r["jsd_bits"], ".4f"), f"{r['n_a']} / {r['n_b']}"]
                for r in inp.action_jsd]
        out += ["Action-distribution Jensen-Shannon divergence (bits) over action kinds of the sealed attempts' turns.",
                ""]
        out += _table(["scope", "a", "b", "JSD (bits)", "turns"], rows, "lllrr", keep=3) + [""]
    out += _figure(inp, "action_jsd", "action-distribution divergence")
    if inp.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in inp.notes] + [""]
    out += ["With few test tasks these numbers carry wide sampling error; they describe this run, not the model in "
            "general.", ""]
    return "\n".join(out)


def _rate(k: Any, n: int, why: str = "") -> str:
    """``k (k/n)`` as a count with its rate; :func:`na` of ``why`` where the count is None."""
    return (na(why) if why else "n/a") if k is None else f"{k} ({k / n:.2f})" if n else str(k)


def step_failures_section(rows: list[dict[str, Any]]) -> list[str]:
    """The report's P6 section (lines of Markdown; none without rows): per checkpoint and
    harness, median (mean) agent steps of the solved and of the failed attempts, then how the
    failed attempts ended and the turn-level errors, as counts with their rate (over failed
    attempts for the endings, over graded attempts for the rest); ``n/a`` with the reason where the
    data cannot say (the row's note; ``analyze/step_failures``,
    :func:`tasks.analysis.steps.step_failures`), a table note like every other."""
    if not rows:
        return []
    out = ["## P6: agent steps and failure modes", "",
           "Agent steps (turns) per graded attempt of the sealed evaluation, solved and failed apart: median (mean). "
           "The paper reports the median steps falling 24-35% after training; compare each arm's row with `base` "
           "under the same harness.", ""]
    def steps(r: dict[str, Any], kind: str) -> str:
        if r[f"median_turns_{kind}"] is None:
            return na(f"no {kind} attempt" if not r["solved" if kind == "solved" else "failed"] else r["note"])
        return f"{_f(r[f'median_turns_{kind}'], '.1f')} ({_f(r[f'mean_turns_{kind}'], '.2f')})"

    body = [[r["checkpoint"], r["harness_name"], str(r["graded"]), str(r["solved"]), steps(r, "solved"),
             steps(r, "failed")] for r in rows]
    out += _table(["checkpoint", "harness", "graded", "solved", "steps solved", "steps failed"], body, "llrrrr",
                  keep=2) + [""]
    out += ["How the failed attempts ended (count (share of failed)): wrong answer given in time, out of turns, "
            "reply cut at the token limit, no answer at all (format), episode timeout; and over all graded "
            "attempts: attempts with a reply the harness answered with its format-error message, with a tool call "
            "that failed (non-zero exit, timeout, a limit), replies cut at the token limit (turns), answers not "
            "in the harness's format.", ""]
    body = [[r["checkpoint"], r["harness_name"], str(r["failed"])]
            + [_rate(r[c], r["failed"], r["note"]) for c in ("failed_submitted", "failed_max_turns", "failed_max_tokens",
                                                            "failed_format_error", "failed_timeout")]
            + [_rate(r["format_error_attempts"], r["graded"], r["note"]),
               _rate(r["tool_error_attempts"], r["graded"], r["note"]),
               na(r["note"]) if r["truncated_turns"] is None else str(r["truncated_turns"]),
               _rate(r["unparsed_answers"], r["graded"], r["note"])] for r in rows]
    out += _table(["checkpoint", "harness", "failed", "wrong answer", "turn limit", "token limit", "no answer",
                   "timeout", "format-error replies", "tool errors", "cut replies", "unparsed"], body,
                  "ll" + "r" * 10, keep=2) + [""]
    return out
