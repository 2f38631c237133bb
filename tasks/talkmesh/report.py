"""The Markdown report and the accuracy-vs-outputs plot of a TalkMesh run (``<run>/talkmesh/``)."""

from __future__ import annotations

import io
from typing import Any

from tasks.talkmesh.config import TalkMeshRunConfig


def _f(x: float | None, d: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def plot_png(curves: list[dict[str, Any]], summary: list[dict[str, Any]]) -> bytes:
    """PNG bytes: accuracy against outputs spent per problem for majority vote and
    confidence-weighted vote (lines, k = 1..K) and each mesh condition without colluders (points).
    Deterministic (no timestamp or software tag in the PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for method, style in (("majority", "-o"), ("confidence_weighted", "-s")):
        pts = sorted((r["outputs_spent"], r["accuracy"]) for r in curves if r["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, markersize=3, label=method.replace("_", "-") + " vote")
    for r in summary:
        if r["colluders"] == 0:
            ax.plot([r["outputs_spent"]], [r["accuracy"]], "*", markersize=12, label=r["condition"])
    return _outputs_axes_png(fig, ax, "accuracy (test problems)", legend_size=8)


def plot_budget_png(budget: list[dict[str, Any]]) -> bytes:
    """PNG bytes: accuracy against outputs spent per problem with interval bands
    (``talkmesh_budget`` rows, :func:`tasks.talkmesh.findings.budget_rows`): majority and
    confidence-weighted vote as lines over k = 1..K with shaded intervals, each mesh condition as
    a point with an error bar. Deterministic (no timestamp or software tag in the PNG).

    Raises:
        ValueError: no rows.
    """
    if not budget:
        raise ValueError("plot_budget_png: no talkmesh_budget rows")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.4), dpi=100)
    for method, style in (("majority", "-o"), ("confidence_weighted", "-s")):
        pts = sorted((r["outputs_spent"], r["accuracy"], r["ci_low"], r["ci_high"]) for r in budget
                     if r["kind"] == "vote" and r["series"] == method)
        if not pts:
            continue
        x = [p[0] for p in pts]
        line, = ax.plot(x, [p[1] for p in pts], style, markersize=3, label=method.replace("_", "-") + " vote @ k")
        ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], color=line.get_color(), alpha=0.15, linewidth=0)
    for r in (r for r in budget if r["kind"] == "mesh"):
        ax.errorbar([r["outputs_spent"]], [r["accuracy"]],
                    yerr=[[r["accuracy"] - r["ci_low"]], [r["ci_high"] - r["accuracy"]]], fmt="*", markersize=11,
                    capsize=3, label=f"{r['series']} ({r['agents']} agents)")
    level = budget[0]["level"]
    return _outputs_axes_png(fig, ax, f"accuracy (test problems; {level:.0%} bootstrap interval)", legend_size=7)


def _outputs_axes_png(fig: Any, ax: Any, ylabel: str, *, legend_size: int) -> bytes:
    """Finish an accuracy-against-outputs figure (log2 x axis, accuracy in [0, 1]) and return its
    PNG bytes (no software tag, so the bytes depend on the data only)."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("outputs spent per problem")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def budget_findings_markdown(budget: list[dict[str, Any]], findings: list[dict[str, Any]],
                             equal_budget: list[dict[str, Any]] | None = None) -> list[str]:
    """Report lines: the pre-registered findings (estimate, interval, verdict; sealed), each
    mesh against majority vote at its own budget
    (:func:`tasks.talkmesh.findings.equal_budget_rows`, descriptive) and the accuracy-vs-outputs
    table with intervals (``talkmesh_budget`` rows at k = 1, 2, 3, 4, 6, 8, 16, 32 and K, and every
    mesh condition). Empty input: no lines."""
    out: list[str] = []
    if findings:
        out += ["", "## Pre-registered findings (sealed: `harnessrl verify RUN` recomputes them from the signed "
                "hash chain)", "", "| finding | mesh | agents | k | mesh acc. | majority@k acc. | mesh - majority@k | "
                "interval (level) | n | claim, margin | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {f['name']} | {f['condition']} | {f['agents']} | {f['k']} | {_f(f['mesh_accuracy'])} | "
                f"{_f(f['majority_accuracy'])} | {f['estimate']:+.3f} | [{f['ci_low']:+.3f}, {f['ci_high']:+.3f}] "
                f"({f['level']:.4f}) | {f['n']} | {f['claim']}, {f['margin']:.2f} | **{f['verdict']}**: "
                f"{f['reason']} |" for f in findings]
    if equal_budget:
        out += ["", "## Each mesh against majority vote at its own budget (descriptive; paired problem bootstrap)", "",
                "| mesh | agents | outputs/problem | k | mesh acc. | majority@k acc. | mesh - majority@k | interval |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {e['condition']} | {e['agents']} | {e['outputs_spent']:.1f} | {e['k']} | {_f(e['mesh_accuracy'])} | "
                f"{_f(e['majority_accuracy'])} | {e['difference']:+.3f} | [{e['ci_low']:+.3f}, {e['ci_high']:+.3f}] "
                f"({e['level']:.0%}) |" for e in equal_budget]
    if budget:
        kmax = max((r["k"] for r in budget if r["kind"] == "vote"), default=0)
        ks = {k for k in (1, 2, 3, 4, 6, 8, 16, 32, kmax) if k <= kmax}
        rows = [r for r in budget if r["kind"] == "mesh" or r["k"] in ks]
        out += ["", f"## Accuracy against outputs spent ({budget[0]['level']:.0%} problem-bootstrap intervals)", "",
                "| series | agents | k | outputs/problem | accuracy | interval |", "|---|---|---|---|---|---|"]
        out += [f"| {r['series']} | {'' if r['agents'] is None else r['agents']} | {'' if r['k'] is None else r['k']} | "
                f"{r['outputs_spent']:.1f} | {_f(r['accuracy'])} | [{_f(r['ci_low'])}, {_f(r['ci_high'])}] |"
                for r in rows]
    return out


def report_markdown(cfg: TalkMeshRunConfig, curves: list[dict[str, Any]], summary: list[dict[str, Any]],
                    calib: list[dict[str, Any]], talk_rows: list[dict[str, Any]], train_steps: list[dict[str, Any]],
                    timing: dict[str, float], contrasts: list[dict[str, Any]] | None = None, *,
                    budget: list[dict[str, Any]] | None = None, findings: list[dict[str, Any]] | None = None,
                    equal_budget: list[dict[str, Any]] | None = None) -> str:
    """The report: the pre-registered findings and the accuracy-vs-outputs table with intervals
    (:func:`budget_findings_markdown`, when the run has them), the mesh and baselines table, the paired contrasts
    (:func:`tasks.talkmesh.baselines.paired_contrasts` rows), the vote curve at a few k, the
    head's calibration, the talk training batch and steps, and the wall-clock timing."""
    tm = cfg.talkmesh
    acc = {(r["method"], r["k"]): r["accuracy"] for r in curves}
    out = [f"# TalkMesh ({cfg.name})", "",
           f"Policy `{cfg.policy.model}` (engine {cfg.policy.engine}), harness `{tm.harness}`; {tm.agents} agents, "
           f"topology {tm.topology}" + (f" (degree {tm.degree})" if tm.topology == "regular" else "") +
           f", {tm.rounds} talk round(s), revise below confidence {tm.threshold}; {tm.train_problems} training and "
           f"{tm.test_problems} test problems; K = {tm.samples} samples per test problem.",
           *budget_findings_markdown(budget or [], findings or [], equal_budget), "",
           "## Mesh and baselines (test problems)", "",
           "| condition | talk | colluders | defended | accuracy | outputs/problem | consensus | revisions | kept | "
           "hints ignored |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        out.append(f"| {r['condition']} | {r['talk']} | {r['colluders']} | {'yes' if r['defended'] else 'no'} | "
                   f"{_f(r['accuracy'])} | {_f(r['outputs_spent'], 1)} | {_f(r['consensus_rate'])} | {r['revisions']} "
                   f"| {r['kept']} | {r['hints_ignored']} |")
    if contrasts:
        out += ["", "## Paired contrasts (same test problems; 95% problem-resampling bootstrap)", "",
                "| a | b | problems | accuracy a | accuracy b | a - b | 95% CI | p |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {c['a']} | {c['b']} | {c['problems']} | {_f(c['accuracy_a'])} | {_f(c['accuracy_b'])} | "
                f"{c['difference']:+.3f} | [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | {c['p_value']:.3f} |"
                for c in contrasts]
    ks = sorted({k for k in (1, 2, 3, 4, 6, 8, 16, 32, tm.agents, tm.samples) if k <= tm.samples})
    out += ["", "## Vote over k samples (accuracy; outputs spent = k)", "",
            "| k | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---|" * len(ks),
            "| majority | " + " | ".join(_f(acc[("majority", k)]) for k in ks) + " |",
            "| confidence-weighted | " + " | ".join(_f(acc[("confidence_weighted", k)]) for k in ks) + " |",
            "", "Plot: `accuracy_vs_outputs.png`.", "", "## Confidence head calibration", ""]
    for split in ("train", "test"):
        rows = [r for r in calib if r["split"] == split]
        if rows:
            n = sum(r["n"] for r in rows)
            out.append(f"- {split}: {n} answers, ECE ({tm.head.bins} equal-width bins) {_f(rows[0]['ece'])}, "
                       f"Brier {_f(rows[0]['brier'])}")
    out += ["", "| split | bin | n | mean confidence | accuracy |", "|---|---|---|---|---|"]
    out += [f"| {r['split']} | [{r['lo']:.1f}, {r['hi']:.1f}) | {r['n']} | {_f(r['mean_confidence'])} | "
            f"{_f(r['accuracy'])} |" for r in calib if r["n"]]
    if tm.train_talk:
        rev = [r["reward"] for r in talk_rows if r["kind"] == "revision"]
        hin = [r["reward"] for r in talk_rows if r["kind"] == "hint"]
        out += ["", "## Talk policy GRPO", "",
                f"{len(rev)} revision and {len(hin)} hint sequences; mean reward (1[revision correct] - 1[proposal "
                f"correct]): revisions {_f(sum(rev) / len(rev) if rev else None)}, hints "
                f"{_f(sum(hin) / len(hin) if hin else None)}; {len(train_steps)} optimizer step(s) "
                f"({cfg.train.algorithm}, lr {cfg.train.lr}).", ""]
        if train_steps:
            out += ["| step | loss | grad norm | zero-advantage groups |", "|---|---|---|---|"]
            out += [f"| {s['step']} | {s['loss']:.4f} | {s['grad_norm']:.3f} | {s['zero_adv_frac']:.2f} |"
                    for s in train_steps]
    out += ["", "## Wall clock", "", " ".join(f"{k} {v:.1f} s;" for k, v in timing.items()), ""]
    return "\n".join(out)
