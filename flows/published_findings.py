"""Findings as data: the rows of ``benchmarks/results/findings.jsonl``, built from a verified run.

A row is published only from a run that :func:`tasks.evaluate.verify.verify_run` accepts (plan,
chain, signatures, and the ``eval_findings`` table recomputed from the sealed rows), and it copies
that table's numbers unchanged, so ``harnessrl verify RUN --findings FILE`` can recompute every
number of every row that names the run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, NamedTuple

from flows.status import STATE_DIR
from schemas import ArtifactStore
from tasks.evaluate.seal import SealError

# the report figures a findings page shows for each published run (analyze/plots/<name>.png)
FIGURES = ("pass_rate_heatmap", "learning_curves", "learning_vs_step", "ceiling_vs_return", "step_failures")
# beside findings.jsonl: one row per training arm of each published run (stability, KL bias, pass@1)
ARMS_FILE = "findings_arms.jsonl"
# beside findings.jsonl: P1's R^2 and rank correlations of C, M, C - M per run with p1 findings (not verdicts)
P1_CORRELATIONS_FILE = "findings_p1_correlations.jsonl"
# the numbers of a row that come from the run's eval_findings table, compared by verify
ROW_NUMBERS = ("estimate", "ci_low", "ci_high", "n", "verdict", "control")
# rule-2 fields (issue 50: the control's interval, training seeds), compared by verify where a row has them
RULE2_FIELDS = ("control_ci_low", "control_ci_high", "seeds", "single_seed", "interval", "rule")
# a row's infra-error fields (tasks.analysis.infra.row_fields), compared by verify where a row has them
INFRA_FIELDS = ("infra_errors", "infra_planned", "infra_total", "infra_threshold")
# P6: what an arm row carries of each analyze/step_failures row (steps, endings, errors; see tasks.analysis.steps)
STEP_FIELDS = ("graded", "solved", "failed", "median_turns_solved", "mean_turns_solved", "median_turns_failed",
               "mean_turns_failed", "failed_submitted", "failed_max_turns", "failed_max_tokens", "failed_format_error",
               "failed_timeout", "format_error_attempts", "tool_error_attempts", "truncated_turns", "unparsed_answers",
               "note")


def run_wall_s(store: ArtifactStore) -> float | None:
    """Seconds the run's stages computed: the sum over stages of each stage record's
    ``compute_seconds`` (the last run of the stage that was not a cache hit; a stage killed and
    resumed counts its last attempt only). None when no stage record has one."""
    total, seen = 0.0, False
    for stage in ("freeze", "rollout", "train", "evaluate", "analyze"):
        rel = f"{STATE_DIR}/{stage}.json"
        if store.exists(rel):
            rec = store.read_json(rel)
            if rec.get("compute_seconds") is not None:
                total += float(rec["compute_seconds"])
                seen = True
    return round(total, 1) if seen else None


def finding_rows(store: ArtifactStore, *, config: str, config_hash: str, commit: str,
                 public_key: bytes | None = None) -> list[dict[str, Any]]:
    """One ``findings.jsonl`` row per finding of a verified run whose infra errors are within the
    findings threshold its sealed plan fixes.

    Fields: ``paper``, ``name``, ``headline``, ``measure``, ``estimate``, ``ci_low``,
    ``ci_high``, ``level`` (the interval's confidence), ``n`` (tasks), ``verdict``, ``reason``,
    ``control`` (the random-reward control's estimate, None where the finding names no control);
    from a run sealed under verdict rule 2 also :func:`rule2_fields` (``control_ci_low``,
    ``control_ci_high``, ``seeds``, ``single_seed``, ``interval``, ``rule``);
    ``config`` (the config file), ``config_hash``, ``commit``, ``key_fingerprint`` (the sealed
    evaluation's Ed25519 signing key), ``plan_hash`` (its sealed plan: which run of the config the
    row is), ``wall_s`` (:func:`run_wall_s`) and the infra-error
    fields of :func:`tasks.analysis.infra.row_fields` (``infra_errors`` and ``infra_planned`` per
    stage, ``infra_total``, ``infra_threshold``).

    Raises:
        NotARunError: not a run with a sealed evaluation.
        SealError: the run does not verify, or its plan names no findings.
        InfraThresholdError: a stage has more infra errors than the threshold allows (one line
            naming the stage, the count and the threshold); no row is returned.
    """
    from tasks.analysis.infra import check_threshold, infra_counts, row_fields, threshold_of
    from tasks.evaluate.verify import verify_run

    rep = verify_run(store, public_key=public_key)
    if not store.exists("evaluate/eval_findings.parquet"):
        raise SealError(f"{store.url}: the sealed plan names no findings (evaluate.findings is not set)")
    counts = infra_counts(store)
    limit = threshold_of(store.read_json("evaluate/plan.json"))
    check_threshold(counts, limit)
    infra = row_fields(counts, limit)
    wall = run_wall_s(store)
    rule = int(store.read_json("evaluate/plan.json").get("findings_rule", 1))
    rows = []
    for f in store.rows(("evaluate", "eval_findings")):
        rows.append({"paper": f["paper"], "name": f["name"], "headline": f["headline"], "measure": f["measure"],
                     "estimate": f["estimate"], "ci_low": f["ci_low"], "ci_high": f["ci_high"], "level": f["level"],
                     "n": f["n"], "verdict": f["verdict"], "reason": f["reason"], "control": f["control_estimate"],
                     **(rule2_fields(f, rule) if rule >= 2 else {}),
                     "config": config, "config_hash": config_hash, "commit": commit,
                     "key_fingerprint": rep.fingerprint, "plan_hash": rep.plan_hash, "wall_s": wall, **infra})
    return rows


def rule2_fields(f: dict[str, Any], rule: int) -> dict[str, Any]:
    """A findings row's :data:`RULE2_FIELDS` from an ``eval_findings`` v2 row ``f`` of a plan sealed
    under verdict ``rule``: the control's interval, ``seeds`` as an object (arm -> training seeds),
    ``single_seed``, ``interval`` (task, seed-task or cell) and ``rule``."""
    return {"control_ci_low": f["control_ci_low"], "control_ci_high": f["control_ci_high"],
            "seeds": json.loads(f["seeds"]), "single_seed": f["single_seed"], "interval": f["interval"], "rule": rule}


class Published(NamedTuple):
    """What :func:`check_published` found: ``compared``, the rows of this run recomputed and equal;
    ``other_runs``, the rows of the same config published from another run (another sealed plan,
    or, for rows older than ``plan_hash``, another signing key), which this run cannot check."""

    compared: int
    other_runs: int


def check_published(store: ArtifactStore, findings_file: Path, config_hash: str, *, plan_hash: str | None = None,
                    fingerprint: str | None = None) -> Published:
    """Compare every row of ``findings_file`` of this run with the run's recomputed
    ``eval_findings`` (call after :func:`~tasks.evaluate.verify.verify_run`, passing its report's
    ``plan_hash`` and ``fingerprint``). A row is this run's when its ``config_hash`` starts with
    ``config_hash`` (a run folder's name ends in the first 10 characters of it) and, with
    ``plan_hash`` given, its own ``plan_hash`` is that one (a row without one, published before
    rows carried it: its ``key_fingerprint`` is ``fingerprint``). The same config run again (on
    another machine, say) has the same folder name but another sealed plan: its rows are counted in
    ``other_runs``, not compared. A row that carries infra-error fields (:data:`INFRA_FIELDS`; rows
    published before they existed do not) is also compared with the counts recomputed from the
    run's artifacts (:func:`tasks.analysis.infra.infra_counts`); one that carries the rule-2 fields
    (:data:`RULE2_FIELDS`) has them compared too.

    Raises:
        SealError: a row's number differs from the run's (naming the row, the field and both
            values), or a row names a finding the run does not have.
    """
    ours = {f["name"]: f for f in store.rows(("evaluate", "eval_findings"))} \
        if store.exists("evaluate/eval_findings.parquet") else {}
    plan = store.read_json("evaluate/plan.json") if store.exists("evaluate/plan.json") else {}
    rule = int(plan.get("findings_rule", 1))
    infra: dict[str, Any] | None = None
    n = other = 0
    for i, line in enumerate(findings_file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not str(row.get("config_hash", "")).startswith(config_hash):
            continue
        if plan_hash is not None and (row["plan_hash"] != plan_hash if "plan_hash" in row else
                                      fingerprint is not None and row.get("key_fingerprint") != fingerprint):
            other += 1
            continue
        f = ours.get(row.get("name"))
        if f is None:
            raise SealError(f"{findings_file}:{i}: finding {row.get('name')!r} is not in the run's eval_findings")
        want = {"estimate": f["estimate"], "ci_low": f["ci_low"], "ci_high": f["ci_high"], "n": f["n"],
                "verdict": f["verdict"], "control": f["control_estimate"]}
        keys: tuple[str, ...] = ROW_NUMBERS
        if any(k in row for k in RULE2_FIELDS):  # rows of a rule-2 run; older rows have none
            if rule < 2:
                raise SealError(f"{findings_file}:{i}: the row carries verdict rule 2's fields, the run's plan was "
                                f"sealed under rule {rule}")
            want.update(rule2_fields(f, rule))
            keys += RULE2_FIELDS
        if any(k in row for k in INFRA_FIELDS):
            if infra is None:
                from tasks.analysis.infra import infra_counts, row_fields, threshold_of

                infra = row_fields(infra_counts(store), threshold_of(store.read_json("evaluate/plan.json")))
            want.update(infra)
            keys += INFRA_FIELDS
        for k in keys:
            if row.get(k) != want[k]:
                raise SealError(f"{findings_file}:{i}: {k}={row.get(k)!r}, recomputed {want[k]!r}")
        n += 1
    return Published(n, other)


def p1_correlation_rows(store: ArtifactStore, run: str, plan_hash: str | None) -> list[dict[str, Any]]:
    """P1's correlations table of a verified run (call after :func:`finding_rows`): the rows of
    :func:`tasks.evaluate.p1_correlations.p1_correlation_table` over the sealed evaluation rows and
    plan, each with ``run`` (the run folder's label) and ``plan_hash`` (which run of the config).
    Empty when the plan has no ``p1_predictor_gap`` finding. Descriptive: no verdict, and
    ``harnessrl verify`` does not compare these rows (they recompute from the same sealed files)."""
    from tasks.evaluate.p1_correlations import p1_cell_sets, p1_correlation_table

    plan = store.read_json("evaluate/plan.json")
    if not p1_cell_sets(plan):
        return []
    return [{"run": run, "plan_hash": plan_hash, **r}
            for r in p1_correlation_table(store.rows(("evaluate", "evaluations")), plan)]


def copy_figures(run_dir: Path, out_dir: Path, prefix: str) -> list[Path]:
    """Copy the run's report figures (:data:`FIGURES`, those it has) to
    ``out_dir/<prefix>--<figure>.png`` for the generated findings page; returns the copies."""
    out = []
    for name in FIGURES:
        src = Path(run_dir) / "analyze" / "plots" / f"{name}.png"
        if src.is_file():
            out_dir.mkdir(parents=True, exist_ok=True)
            dst = out_dir / f"{prefix}--{name}.png"
            shutil.copyfile(src, dst)
            out.append(dst)
    return out


def arm_rows(store: ArtifactStore, cfg: Any, run: str) -> list[dict[str, Any]]:
    """One row per training arm of an analysed run, for the findings page's arm table (P5, P6):
    ``run``, ``arm``, ``kl_config`` (estimator/placement[/stale[-is]], ``""`` without KL),
    ``beta``, ``max_staleness``, ``unbiased`` and ``relative_bias`` (P5's estimator table by
    enumeration, ``analyze/kl_check``; None where the run has none or the arm has no KL),
    ``stable`` and ``reason`` (the pre-registered rule, ``analyze/training_stability``),
    ``early_reward``/``late_reward``, and ``pass_at_1`` per (harness, suite) with the interval
    (``analyze/suite_pass_rates``); ``steps`` and ``base_steps`` (P6): the arm's and the base
    checkpoint's rows of ``analyze/step_failures`` per evaluation harness (:data:`STEP_FIELDS`;
    empty where the run has no such table). Empty when the run has no analysed arms.

    Raises:
        ArtifactError: an analyze artifact differs from its manifest.
    """
    from tasks.analysis.tables import arm_spec

    if not store.exists("analyze/training_stability.manifest.json"):
        return []
    stab = {r["arm"]: r for r in store.rows(("analyze", "training_stability"))}
    kl = {r["configuration"]: r for r in store.rows(("analyze", "kl_check"))} \
        if store.exists("analyze/kl_check.manifest.json") else {}
    rates = store.rows(("analyze", "suite_pass_rates")) if store.exists("analyze/suite_pass_rates.manifest.json") else []
    steps = store.rows(("analyze", "step_failures")) if store.exists("analyze/step_failures.manifest.json") else []

    def steps_of(ck: str) -> list[dict[str, Any]]:
        return [{"harness": r["harness_name"], **{k: r[k] for k in STEP_FIELDS}}
                for r in steps if r["checkpoint"] == ck]

    out = []
    for name, tc in cfg.arm_configs():
        spec = arm_spec(name, tc)
        k = kl.get(spec["kl_config"])
        s = stab.get(name, {})
        out.append({"run": run, "arm": name, "kl_config": spec["kl_config"], "beta": spec["beta"],
                    "max_staleness": spec["max_staleness"], "reward_control": tc.reward_control,
                    "unbiased": None if k is None else bool(k["unbiased"]),
                    "relative_bias": None if k is None else k["relative_bias"],
                    "stable": s.get("stable"), "reason": s.get("reason", ""),
                    "early_reward": s.get("early_reward"), "late_reward": s.get("late_reward"),
                    "pass_at_1": [{"harness": r["harness_name"], "suite": r["suite"], "pass_at_1": r["pass_at_1"],
                                   "ci_low": r["ci_low"], "ci_high": r["ci_high"]}
                                  for r in rates if r["checkpoint"] == name],
                    "steps": steps_of(name), "base_steps": steps_of(cfg.analyze.reference)})
    return out
