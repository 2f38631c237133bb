"""The analyze stage: the sealed evaluation and the training rollouts -> P1 and P4 tables, figures
and the run report.

Tables (each a contracted Parquet artifact): ``mismatch`` (ceilings and mismatch per checkpoint
and harness), ``p1_points`` (C, C_kl_soft, M, M_step, C - M, C - M_step of the base policy per
harness beside each trained checkpoint's gain and return), ``predictors`` (their R^2, or n/a with
the reason), ``step_mismatch`` (branching; only when
``analyze.branching.episodes_per_harness`` > 0), ``log_odds`` + ``log_odds_pairs`` (only with a
trained checkpoint and ``analyze.log_odds.max_states_per_harness`` > 0), ``leakage`` (Within vs
Cross), ``action_jsd``, ``step_failures`` (P6: agent steps per solved and failed attempt, failure
modes). Figures: ``analyze/plots/*.png``; report: ``analyze/report.md``.
An analysis that cannot be computed for this run (one training harness: no leakage classifier)
leaves a null figure with a note saying why, never a made-up number.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.analysis.checkpoint_tables import branching_rows, log_odds_tables
from tasks.analysis.tables import arm_spec, kl_beta, leakage_rows
from tasks.config import RunConfig
from tasks.registries.applications import applications_apart, enters_engine_tables

log = logging.getLogger("harnessrl.analyze")

REPORT = "analyze/report.md"
PLOTS = "analyze/plots"


def _figures(store: ArtifactStore, tables: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    from tasks.analysis import plots

    made = {
        "learning_curves": plots.learning_curves(tables["train_steps"]),
        "pass_rate_heatmap": plots.pass_rate_heatmap(tables["eval_cells"]),
        "learning_vs_step": plots.learning_vs_step(tables["learning_curve"], tables["train_steps"]),
        "ceiling_vs_return": plots.ceiling_vs_return(tables["mismatch"]),
        "r2_comparison": plots.r2_comparison(tables["predictors"]),
        "leakage": plots.leakage_plot(tables["leakage"]),
        "action_jsd": plots.action_jsd_plot(tables["action_jsd"]),
        "step_failures": plots.steps_plot(tables.get("step_failures", [])),
    }
    out = {}
    for name, png in made.items():
        if png is not None:
            store.write_bytes(f"{PLOTS}/{name}.png", png)
            out[name] = f"plots/{name}.png"
    return out


def run_analyze(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Write the P1/P4 tables, the figures and ``analyze/report.md``.

    Raises:
        ValueError: ``analyze.reference`` or a ``analyze.branching.checkpoints`` entry is not a
            checkpoint of this run.
    """
    from tasks.progress import progress

    # progress part by part (PARTS), so a long analyze is never silent
    with progress("analyze", len(PARTS), "parts") as advance:
        return _analyze(store, cfg, inputs, advance)


# what run_analyze advances over, in order: each part advances the bar once when it is done
PARTS = ("per-step branching", "log-odds check", "P1 tables", "leakage, JSD and arm tables", "figures and report")


def _analyze(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], advance: Any
             ) -> dict[str, ArtifactRef]:
    from tasks.analysis.ceiling import mismatch_cells
    from tasks.analysis.leakage import action_distributions, jsd_table
    from tasks.analysis.predictors import p1_points, r2_table
    from tasks.analysis.infra import infra_counts, online_arm_names
    from tasks.analysis.report import ReportInputs, render_report, report_notes
    from tasks.harnesses.frozen import harness_specs

    a = cfg.analyze
    evals = store.rows(inputs["evaluations"])
    names = {c["name"] for c in store.rows(inputs["checkpoints"])}
    if a.reference not in names:
        raise ValueError(f"analyze.reference={a.reference!r} is not a checkpoint of this run {sorted(names)}")
    beta = kl_beta(cfg)
    specs = harness_specs(store, inputs["harnesses"])
    ch = cfg.section_hash("analyze", "policy", "sandbox", "train")
    ev_in = [inputs["evaluations"]]
    notes: list[str] = []

    with tempfile.TemporaryDirectory(prefix="harnessrl-analyze-") as tmp_s:
        tmp = Path(tmp_s)
        steps = branching_rows(store, cfg, inputs, specs, evals, tmp)
        advance(1)
        lo_summary, lo_pairs = log_odds_tables(store, cfg, inputs, specs, tmp)
        advance(1)

    step_summary: list[dict[str, Any]] = []
    if steps:
        from tasks.analysis.branching import step_mismatch_summary

        step_summary = [{"checkpoint": ck, **s} for ck in dict.fromkeys(r["checkpoint"] for r in steps)
                        for s in step_mismatch_summary([r for r in steps if r["checkpoint"] == ck])]
    m_step = {(s["checkpoint"], s["harness_name"]): s["m_step"] for s in step_summary if s["m_step"] is not None}
    mismatch = mismatch_cells(evals, k=a.ceiling_k, beta=beta, reference=a.reference)
    for r in mismatch:
        ms = m_step.get((r["checkpoint"], r["harness_name"]))
        r["mismatch_step"] = ms
        r["predicted_return"] = None if ms is None or r["ceiling"] is None else r["ceiling"] - ms
    ref_step = {h: v for (ck, h), v in m_step.items() if ck == a.reference}
    points = p1_points(evals, k=a.ceiling_k, beta=beta, reference=a.reference, m_step=ref_step)
    predictors = r2_table(evals, k=a.ceiling_k, beta=beta, reference=a.reference, resamples=a.bootstrap_resamples,
                          seed=a.seed, m_step=ref_step)
    if not points:
        notes.append("P1's R^2 not computed: it needs at least one trained checkpoint besides the reference "
                     f"{a.reference!r}, evaluated under a harness the reference was evaluated under.")

    advance(1)
    episodes = store.rows(inputs["episodes"])
    # the harnesses of an application's loop type whose episodes stay out of the engine tables
    # (tasks.registries.applications: engine_tables), with the application's note and report section
    apart = applications_apart(specs)
    plain_eps = [e for e in episodes if enters_engine_tables(specs[e["harness_id"]].loop_type)]
    for app, names in apart:
        if app.analysis_note is not None:
            notes.append(app.analysis_note(names))
    leakage = leakage_rows(plain_eps, cfg) if plain_eps else []
    notes += [f"{r['rule']}: {r['note']}" for r in leakage if r["note"]]
    labels = {e["eval_id"]: (e["checkpoint"], e["harness_name"]) for e in evals}
    eval_turns = store.rows(inputs["eval_turns"], contract="turns")
    jsd = jsd_table(action_distributions(eval_turns, labels))
    from tasks.analysis.steps import step_failures

    # P6: agent steps per solved / failed attempt and the failure modes (a single-reply harness has no turn
    # limit; an application's loop type outside the engine tables, such as a mesh's agent messages: left out)
    tasks_rows = store.rows(inputs["tasks"])
    steps_fail = step_failures(
        [e for e in evals if enters_engine_tables(specs[e["harness_id"]].loop_type)], eval_turns,
        {s.name: (None if s.loop_type == "single_turn" else s.max_turns) for s in specs.values()},
        {t["task_id"] for t in tasks_rows if t["environment"] == "answer"})

    from tasks.analysis.arms import suite_pass_rates, training_stability

    train_steps = store.rows(inputs["train_steps"])
    suite_of = {t["task_id"]: t["suite"] for t in tasks_rows}
    suites = suite_pass_rates(evals, suite_of, resamples=a.bootstrap_resamples, seed=a.seed)
    stability = training_stability(train_steps, a.divergence_kl,
                                   a.stability.model_dump() if a.stability else None)
    from tasks.analysis.learning import learning_curve

    curve = learning_curve(evals, store.rows(inputs["checkpoints"]), train_steps,
                           [name for name, _ in cfg.arm_configs()], resamples=a.bootstrap_resamples, seed=a.seed)
    for r in stability:
        if not r["stable"]:
            notes.append(f"arm {r['arm']} unstable: {r['reason']}")
    kl_rows: list[dict[str, Any]] = []
    if a.kl_check:
        from tasks.train.kl_check import kl_check_table

        kl_rows = kl_check_table(seed=a.seed)

    advance(1)
    refs = {
        "suite_pass_rates": store.write("analyze", "suite_pass_rates", suites, inputs=[*ev_in, inputs["tasks"]],
                                        config_hash=ch),
        "training_stability": store.write("analyze", "training_stability", stability,
                                          inputs=[inputs["train_steps"]], config_hash=ch),
        "learning_curve": store.write("analyze", "learning_curve", curve,
                                      inputs=[*ev_in, inputs["checkpoints"], inputs["train_steps"]], config_hash=ch),
        "mismatch": store.write("analyze", "mismatch", mismatch, inputs=ev_in, config_hash=ch),
        "p1_points": store.write("analyze", "p1_points", points, inputs=ev_in, config_hash=ch),
        "predictors": store.write("analyze", "predictors", predictors, inputs=ev_in, config_hash=ch),
        "leakage": store.write("analyze", "leakage", leakage, inputs=[inputs["episodes"]], config_hash=ch),
        "action_jsd": store.write("analyze", "action_jsd", jsd, inputs=[*ev_in, inputs["eval_turns"]],
                                  config_hash=ch),
        "step_failures": store.write("analyze", "step_failures", steps_fail,
                                     inputs=[*ev_in, inputs["eval_turns"], inputs["harnesses"], inputs["tasks"]],
                                     config_hash=ch),
    }
    if kl_rows:
        refs["kl_check"] = store.write("analyze", "kl_check", kl_rows, config_hash=ch)
    if steps:
        refs["step_mismatch"] = store.write("analyze", "step_mismatch", steps, inputs=[*ev_in, inputs["eval_turns"]],
                                            config_hash=ch)
    if lo_pairs or lo_summary:
        lo_in = [inputs["episodes"], inputs["turns"], inputs["checkpoints"]]
        refs["log_odds"] = store.write("analyze", "log_odds", lo_summary, inputs=lo_in, config_hash=ch)
        refs["log_odds_pairs"] = store.write("analyze", "log_odds_pairs", lo_pairs, inputs=lo_in, config_hash=ch)

    tables = {"train_steps": train_steps, "eval_cells": store.rows(inputs["eval_cells"]), "learning_curve": curve,
              "mismatch": mismatch, "predictors": predictors, "leakage": leakage, "action_jsd": jsd,
              "step_failures": steps_fail}
    figures = _figures(store, tables)
    with report_notes():  # one numbering of the table notes, the appended applications' sections included
        report = render_report(ReportInputs(
            run_name=cfg.name, config_hash=cfg.config_hash(), model=cfg.policy.model,
            plan_hash=evals[0]["plan_hash"] if evals else "", seal_head=evals[-1]["seal_hash"] if evals else "",
            episodes=episodes, train_steps=tables["train_steps"],
            timing=store.manifest("train", "train_steps").get("extra", {}).get("timing", []),
            eval_cells=tables["eval_cells"], eval_contrasts=store.rows(inputs["eval_contrasts"]), mismatch=mismatch,
            predictors=predictors, p1_points=points, step_mismatch=step_summary, log_odds=lo_summary, leakage=leakage, action_jsd=jsd,
            figures=figures, notes=notes, suite_pass_rates=suites, stability=stability, kl_check=kl_rows,
            arms=[arm_spec(name, tc) for name, tc in cfg.arm_configs()], learning_curve=curve, step_failures=steps_fail,
            infra=infra_counts(store, online_arm_names(cfg))))
        for app, names in apart:
            if app.report_section is not None:
                report = report.rstrip("\n") + "\n\n" + app.report_section(store, inputs, evals, eval_turns, names)
    store.write_text(REPORT, report)
    advance(1)

    def f3(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    for r in mismatch:
        log.info("%s / %s: pass@1 %s, ceiling pass@%d %s, mismatch %s, KL-soft ceiling (b %s) %s", r["checkpoint"],
                 r["harness_name"], f3(r["pass_at_1"]), r["ceiling_k"], f3(r["ceiling"]), f3(r["mismatch"]),
                 r["kl_beta"], f3(r["ceiling_kl_soft"]))
    for r in predictors:
        if r["na_reason"]:
            log.info("R^2 %s ~ %s: n/a (%s)", r["target"], r["predictor"], r["na_reason"])
        else:
            log.info("R^2 %s ~ %s: %.3f [%s, %s] over %d points", r["target"], r["predictor"], r["r2"],
                     "n/a" if r["ci_low"] is None else f"{r['ci_low']:.3f}",
                     "n/a" if r["ci_high"] is None else f"{r['ci_high']:.3f}", r["n_points"])
    for r in leakage:
        log.info("%s: zero-advantage groups %d/%d, leakage %s pp", r["rule"], r["zero_groups"], r["n_groups"],
                 "n/a" if r["leakage_pp"] is None else f"{r['leakage_pp']:+.2f}")
    return refs
