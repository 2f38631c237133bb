"""The report's figures: matplotlib (Agg) figures rendered to PNG bytes.

Every function takes artifact rows (dicts, as :meth:`schemas.ArtifactStore.rows` returns them)
and returns the PNG as ``bytes``, or None when the rows hold nothing to draw. PNGs are written
without a creation time or software stamp, so the same rows give the same bytes on one machine.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_PNG_META = {"Software": None}
_DPI = 110


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata=_PNG_META, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def figure_png(fig: Any) -> bytes:
    """``fig`` (a matplotlib figure) as PNG bytes at the report's DPI, with no creation time or
    software stamp (the same figure gives the same bytes on one machine); closes ``fig``. For an
    application's figures (they draw their own; the core draws none of theirs)."""
    return _png(fig)


def _step_axis(ax: Any, label: str = "step") -> None:
    """An x axis of optimizer steps: labelled, ticks on whole steps only (2 steps: 1 and 2, not
    1.0, 1.2, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finite(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def learning_curves(steps: list[dict[str, Any]]) -> bytes | None:
    """Per training arm (``arm`` column; rows without one are the single arm ``final``), against
    the optimizer step: mean reward over the step's samples, KL to the reference (nats per token,
    the configured estimator), policy entropy (nats per token), gradient norm (before clipping)
    and clip fraction (P5 reads stability from these). A panel with no finite value in any arm
    says so (the KL is not computed at beta 0) instead of drawing empty axes."""
    if not steps:
        return None
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_arm[s.get("arm") or "final"].append(s)
    metrics = [("reward_mean", "mean reward"), ("kl", "KL to reference (nats/token)"),
               ("entropy", "entropy (nats/token)"), ("grad_norm", "gradient norm"), ("clip_frac", "clip fraction")]
    fig, grid = plt.subplots(2, 3, figsize=(13, 6.4))
    axes = grid.ravel()
    styles = ["-", "--", ":", "-."]
    for ax, (col, label) in zip(axes, metrics):
        drawn = False
        for i, (arm, rows) in enumerate(sorted(by_arm.items())):
            rows = sorted(rows, key=lambda r: r["step"])
            pts = [(r["step"], r[col]) for r in rows if isinstance(r.get(col), (int, float)) and math.isfinite(r[col])]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, linestyle=styles[(i // 10) % len(styles)], label=arm)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "n/a: not measured in any arm\n(the KL is computed only when beta > 0)"
                    if col == "kl" else "n/a: no finite value", ha="center", va="center", transform=ax.transAxes)
        _step_axis(ax)
        ax.set_title(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].axis("off")
    axes[-1].legend(handles, labels, loc="center", fontsize=8, ncol=1 if len(labels) <= 12 else 2, title="arm")
    fig.tight_layout()
    return _png(fig)


def learning_vs_step(curve: list[dict[str, Any]], steps: list[dict[str, Any]]) -> bytes | None:
    """Left: each arm's training reward (``reward_mean`` of every optimizer step) against the
    step. Right: sealed pass@1 of the arm's checkpoints (base at step 0, snapshots, final) against
    the training step, one line per (arm, evaluation harness), with the bootstrap interval as
    error bars (``learning_curve`` rows). None without curve rows."""
    rows = [r for r in curve if _finite(r["pass_at_1"])]
    if not rows:
        return None
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.6))
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_arm[s.get("arm") or "final"].append(s)
    for arm, rs in sorted(by_arm.items()):
        rs = sorted(rs, key=lambda r: r["step"])
        ax0.plot([r["step"] for r in rs], [r["reward_mean"] for r in rs], label=arm, alpha=0.8)
    _step_axis(ax0, "optimizer step")
    ax0.set_title("training reward (mean over the step's samples)")
    ax0.grid(alpha=0.3)
    if by_arm:
        ax0.legend(fontsize=8)
    lines: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        lines[(r["arm"], r["harness_name"])].append(r)
    for (arm, h), rs in sorted(lines.items()):
        rs = sorted(rs, key=lambda r: r["step"])
        x = [r["step"] for r in rs]
        y = [r["pass_at_1"] for r in rs]
        err = [[max(r["pass_at_1"] - r["ci_low"], 0.0) for r in rs], [max(r["ci_high"] - r["pass_at_1"], 0.0) for r in rs]]
        ax1.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"{arm} / {h}")
    _step_axis(ax1, "optimizer step")
    ax1.set_ylim(0.0, 1.0)
    ax1.set_title("sealed held-out pass@1 (95% bootstrap CI)")
    ax1.grid(alpha=0.3)
    # beside the axes, in columns of at most LEGEND_ROWS: inside, many (arm, harness) lines hid the plot
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
               ncol=max(1, math.ceil(len(lines) / LEGEND_ROWS)), frameon=False)
    return _png(fig)


def pass_rate_heatmap(cells: list[dict[str, Any]]) -> bytes | None:
    """The train x eval harness matrix of the sealed evaluation: pass@1 per (checkpoint, eval
    harness) ``cell`` row of ``eval_cells``; held-out harnesses are marked ``(held out)``, cells
    that do not count (coverage below the rule) are blank and marked ``n/c``."""
    rows = [c for c in cells if c["kind"] == "cell"]
    if not rows:
        return None
    cks = list(dict.fromkeys(c["checkpoint"] for c in rows))
    hs = list(dict.fromkeys(c["harness_name"] for c in rows))
    held = {c["harness_name"] for c in rows if c["held_out"]}
    val = {(c["checkpoint"], c["harness_name"]): c["pass_at_1"] for c in rows}
    grid = [[val.get((ck, h)) if _finite(val.get((ck, h))) else math.nan for h in hs] for ck in cks]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(hs), 1.0 + 0.55 * len(cks)))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i, ck in enumerate(cks):
        for j, h in enumerate(hs):
            v = grid[i][j]
            ax.text(j, i, "n/c" if math.isnan(v) else f"{v:.2f}", ha="center", va="center",
                    color="white" if math.isnan(v) or v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(len(hs)), [f"{h}\n(held out)" if h in held else h for h in hs], fontsize=8)
    ax.set_yticks(range(len(cks)), cks, fontsize=8)
    ax.set_xlabel("evaluation harness")
    ax.set_ylabel("checkpoint")
    ax.set_title("sealed pass@1")
    fig.colorbar(im, ax=ax, fraction=0.05)
    return _png(fig)


#: entries per column of a legend drawn beside its axes
LEGEND_ROWS = 14
#: panels per row of :func:`ceiling_vs_return` (one panel per checkpoint)
CEILING_PANELS_PER_ROW = 5


def ceiling_vs_return(mismatch: list[dict[str, Any]]) -> bytes | None:
    """Per (checkpoint, harness): the deployed return (pass@1) as a bar, the gap up to the pass@K
    ceiling stacked on it (the mismatch M = C - pass@1), and the KL-soft ceiling as a marker. One
    panel per checkpoint (its harnesses side by side, in the rows' order), at most
    :data:`CEILING_PANELS_PER_ROW` panels a row, so that many checkpoints wrap into rows instead
    of one unreadably wide strip."""
    rows = [r for r in mismatch if _finite(r.get("pass_at_1"))]
    if not rows:
        return None
    by_ck: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_ck[r["checkpoint"]].append(r)
    cks = list(by_ck)
    ncols = min(CEILING_PANELS_PER_ROW, len(cks))
    nrows = math.ceil(len(cks) / ncols)
    width = max(len(v) for v in by_ck.values())
    fig, axes = plt.subplots(nrows, ncols, figsize=(0.6 + (0.5 + 0.45 * width) * ncols, 0.6 + 2.9 * nrows),
                             squeeze=False, sharey=True)
    k = rows[0].get("ceiling_k")
    for n, ck in enumerate(cks):
        ax = axes[n // ncols][n % ncols]
        rs = by_ck[ck]
        x = list(range(len(rs)))
        p1 = [r["pass_at_1"] for r in rs]
        gap = [max(0.0, r["ceiling"] - r["pass_at_1"]) if _finite(r.get("ceiling")) else 0.0 for r in rs]
        ax.bar(x, p1, color="#4c72b0", label="deployed return (pass@1)")
        ax.bar(x, gap, bottom=p1, color="#dd8452", alpha=0.8, label=f"mismatch (pass@{k} ceiling - pass@1)")
        soft = [(i, r["ceiling_kl_soft"]) for i, r in enumerate(rs) if _finite(r.get("ceiling_kl_soft"))]
        if soft:
            ax.scatter([i for i, _ in soft], [v for _, v in soft], marker="_", s=300, color="black", zorder=3,
                       label="KL-soft ceiling")
        ax.set_xticks(x, [r["harness_name"] for r in rs], fontsize=7, rotation=35, ha="right")
        ax.set_xlim(-0.6, width - 0.4)
        ax.set_ylim(0, 1.05)
        ax.set_title(ck, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if n % ncols == 0:
            ax.set_ylabel("success rate")
    for n in range(len(cks), nrows * ncols):
        axes[n // ncols][n % ncols].axis("off")
    # every panel's entries, once each (a panel may lack the KL-soft marker another has)
    entries = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels())}
    handles, labels = list(entries.values()), list(entries)
    fig.legend(handles, labels, fontsize=7, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("harness ceiling vs deployed return", y=1.04)
    fig.tight_layout()
    return _png(fig)


def r2_comparison(predictors: list[dict[str, Any]]) -> bytes | None:
    """R^2 of each predictor of each target with its bootstrap interval, side by side. A row whose
    R^2 is n/a (``na_reason`` set: too few points, a constant side, not measured) gets no bar but
    the label "n/a" with the short reason; None when no row has an R^2 (the report's table says
    why), so the figure never shows a number for an undefined statistic."""
    if not any(_finite(r.get("r2")) and not r.get("na_reason") for r in predictors):
        return None
    targets = list(dict.fromkeys(r["target"] for r in predictors))
    fig, axes = plt.subplots(1, len(targets), figsize=(4.8 * len(targets), 3.6), squeeze=False)
    for ax, t in zip(axes[0], targets):
        rows = [r for r in predictors if r["target"] == t]
        for i, r in enumerate(rows):
            if r.get("na_reason") or not _finite(r.get("r2")):
                why = r.get("na_reason") or "undefined"
                short = "not measured" if why.startswith("not measured") else why.split(":")[0].split(" (")[0]
                ax.text(i, 0.02, f"n/a\n{short}", ha="center", va="bottom", fontsize=6, rotation=90, color="#555555")
                continue
            lo = max(0.0, r["r2"] - r["ci_low"]) if _finite(r.get("ci_low")) else 0.0
            hi = max(0.0, r["ci_high"] - r["r2"]) if _finite(r.get("ci_high")) else 0.0
            ax.bar([i], [r["r2"]], yerr=[[lo], [hi]], capsize=4, color="#55a868")
        ax.set_xticks(range(len(rows)), [r["predictor"] for r in rows], fontsize=8, rotation=20)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"target: {t} (points: {max(r['n_points'] for r in rows)})")
        ax.set_ylabel("R^2")
    return _png(fig)


def leakage_plot(leakage: list[dict[str, Any]]) -> bytes | None:
    """Harness-identity leakage (classifier accuracy minus the shuffled-label null, percentage
    points, with its interval) and the fraction of zero-advantage groups, per grouping rule."""
    if not leakage:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    x = list(range(len(leakage)))
    names = [r["rule"] for r in leakage]
    ok = [(i, r) for i, r in enumerate(leakage) if _finite(r.get("leakage_pp"))]
    if ok:
        v = [r["leakage_pp"] for _, r in ok]
        err = [[max(0.0, a - r["ci_low"]) for a, (_, r) in zip(v, ok)],
               [max(0.0, r["ci_high"] - a) for a, (_, r) in zip(v, ok)]]
        axes[0].bar([i for i, _ in ok], v, yerr=err, capsize=4, color="#c44e52")
    for i, r in enumerate(leakage):
        if not _finite(r.get("leakage_pp")):
            axes[0].text(i, 0, "n/a", ha="center", va="bottom")
    axes[0].axhline(0, color="black", lw=0.8)
    axes[0].set_xticks(x, names)
    axes[0].set_ylabel("accuracy - null (pp)")
    axes[0].set_title("harness-identity leakage")
    axes[1].bar(x, [r["zero_group_fraction"] for r in leakage], color="#8172b2")
    axes[1].set_xticks(x, names)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("zero-advantage groups (fraction)")
    return _png(fig)


def action_jsd_plot(jsd: list[dict[str, Any]]) -> bytes | None:
    """Action-distribution JSD (bits) between harnesses within a checkpoint (blue) and between
    checkpoints within a harness (orange), one bar per pair."""
    if not jsd:
        return None
    rows = sorted(jsd, key=lambda r: (r["scope"] != "between_harnesses", r["checkpoint_a"], r["harness_a"],
                                      r["checkpoint_b"], r["harness_b"]))
    labels = [f"{r['checkpoint_a']}: {r['harness_a']} vs {r['harness_b']}" if r["scope"] == "between_harnesses"
              else f"{r['harness_a']}: {r['checkpoint_a']} vs {r['checkpoint_b']}" for r in rows]
    colors = ["#4c72b0" if r["scope"] == "between_harnesses" else "#dd8452" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.28 * len(rows)))
    y = list(range(len(rows)))
    ax.barh(y, [r["jsd_bits"] for r in rows], color=colors)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("JSD (bits)")
    ax.set_title("action-distribution divergence (blue: between harnesses, orange: between checkpoints)", fontsize=9)
    return _png(fig)


def steps_plot(rows: list[dict[str, Any]]) -> bytes | None:
    """P6 (``step_failures`` rows): left, the mean agent steps (turns) of the solved and of the
    failed sealed attempts per (checkpoint, harness), a missing bar where the cell has none;
    right, how the failed attempts ended, as shares of the cell's failed attempts stacked by
    reason (cells whose endings are n/a, or with no failed attempt, are left empty)."""
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (r["harness_name"], r["checkpoint"]))
    labels = [f"{r['harness_name']}: {r['checkpoint']}" for r in rows]
    y = list(range(len(rows)))
    height = 1.2 + 0.32 * len(rows)  # inches
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, height), sharey=True)
    for off, col, name, color in ((-0.2, "mean_turns_solved", "solved", "#55a868"),
                                  (0.2, "mean_turns_failed", "failed", "#c44e52")):
        a1.barh([v + off for v in y], [r[col] if _finite(r[col]) else 0.0 for r in rows], height=0.4, color=color,
                label=name)
    a1.set_yticks(y, labels, fontsize=7)
    a1.set_ylim(len(rows) - 0.5, -0.5)  # first cell on top, no blank rows above or below
    a1.set_xlabel("mean agent steps (turns)")
    # the legends sit outside the axes: inside, they hid bars that reach the axes' edge
    a1.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    left = [0.0] * len(rows)
    ends = [("failed_submitted", "wrong answer"), ("failed_max_turns", "turn limit"),
            ("failed_max_tokens", "token limit"), ("failed_format_error", "no answer"), ("failed_timeout", "timeout")]
    for col, name in ends:
        share = [r[col] / r["failed"] if r["failed"] and r[col] is not None else 0.0 for r in rows]
        a2.barh(y, share, left=left, label=name)
        left = [a + b for a, b in zip(left, share)]
    a2.set_xlim(0, 1.0)
    a2.set_xlabel("share of failed attempts")
    a2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    # fixed margins in inches (matplotlib's default top margin is a share of the height: on a
    # figure of fifty cells it left two inches blank above the plots)
    fig.subplots_adjust(top=1.0 - 0.6 / height, bottom=0.6 / height)
    fig.suptitle("P6: agent steps and how failed attempts ended", fontsize=9, y=1.0 - 0.05 / height, va="top")
    return _png(fig)
