"""One Prefect flow per stage. Each reads like its line in docs/design.md; the logic is in tasks/."""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import flow, get_run_logger

from flows.common import call_stage, stage_task
from flows.naming import flow_run_namer
from tasks.analysis.ui_tables import ui_rows
from schemas import ArtifactRef, ArtifactStore
from tasks.analysis.stage import run_analyze
from tasks.config import RunConfig
from tasks.evaluate.stage import run_evaluate
from tasks.records.stage import run_freeze
from tasks.rollout.loop_plugins import state_artifacts
from tasks.rollout.stage import run_rollout
from tasks.train.stage import run_train

def freeze_and_preregister(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """The freeze stage as the pipeline runs it: :func:`tasks.records.stage.run_freeze`, then the
    evaluation's pre-registration (evaluation harnesses, contrasts, alpha, findings) written into
    the freeze folder, hashed and signed before any training (:mod:`tasks.evaluate.prereg`). Kept
    here, above both layers, so that the records layer never imports the evaluation layer."""
    from tasks.evaluate.prereg import PREREG, write_preregistration

    out = run_freeze(store, cfg, inputs)
    logging.getLogger("harnessrl.freeze").info("pre-registered the evaluation (%s, SHA-256 %s), signed", PREREG,
                                               write_preregistration(store, cfg)[:16])
    return out


freeze_task = stage_task("freeze", freeze_and_preregister)
rollout_task = stage_task("rollout", run_rollout)
train_task = stage_task("train", run_train)
evaluate_task = stage_task("evaluate", run_evaluate)
analyze_task = stage_task("analyze", run_analyze)


def _timed(stage: str, task: Any, run_dir: str, cfg: RunConfig, inputs: dict[str, ArtifactRef],
           force: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    outputs, state = call_stage(task, run_dir, cfg, inputs, force)
    seconds = time.perf_counter() - t0
    get_run_logger().info("%s: %s in %.1f s -> %s", stage, state, seconds,
                          ", ".join(f"{k} ({v.rows} rows, {v.sha256[:12]})" for k, v in outputs.items()))
    return {"outputs": outputs, "state": state, "seconds": seconds}


def freeze_then(name: str, task_: Any, run_dir: str, cfg: RunConfig, force_freeze: bool = False) -> dict[str, Any]:
    """The body of an experiment flow beside the pipeline (call inside a flow): freeze, cached by
    content like the pipeline's, then ``task_(run_dir, cfg, frozen)``. Returns ``{"freeze": refs,
    name: refs, "seconds": wall-clock seconds of the task}``."""
    frozen, _ = call_stage(freeze_task, run_dir, cfg, {}, force_freeze)
    t0 = time.perf_counter()
    refs = task_(run_dir, cfg, frozen)
    seconds = time.perf_counter() - t0
    get_run_logger().info("%s: %.1f s -> %s", name, seconds, ", ".join(f"{k} ({v.rows} rows)" for k, v in refs.items()))
    return {"freeze": frozen, name: refs, "seconds": seconds}


@flow(name="freeze", flow_run_name=flow_run_namer("freeze"))
def freeze_flow(run_dir: str, cfg: RunConfig, force: bool = False) -> dict[str, Any]:
    """Task suites x harness specs become content-addressed, split, frozen task-harness records."""
    return _timed("freeze", freeze_task, run_dir, cfg, {}, force)


@flow(name="rollout", flow_run_name=flow_run_namer("rollout"))
def rollout_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], force: bool = False) -> dict[str, Any]:
    """The base policy runs through each harness on each train task; every turn, token and log-prob is kept."""
    return _timed("rollout", rollout_task, run_dir, cfg, frozen, force)


@flow(name="train", flow_run_name=flow_run_namer("train"))
def train_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
               force: bool = False) -> dict[str, Any]:
    """GRPO/GSPO on a LoRA adapter over the rollouts; a checkpoint and per-step metrics come out."""
    inputs = {"tasks": frozen["tasks"], "harnesses": frozen["harnesses"], "records": frozen["records"], **rollouts}
    return _timed("train", train_task, run_dir, cfg, inputs, force)


@flow(name="evaluate", flow_run_name=flow_run_namer("evaluate"))
def evaluate_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
                  trained: dict[str, ArtifactRef], force: bool = False) -> dict[str, Any]:
    """Held-out tasks x evaluation harnesses x checkpoints, under a plan sealed before the first attempt."""
    inputs = {**frozen, "episodes": rollouts["episodes"], "checkpoints": trained["checkpoints"]}
    if "online_episodes" in trained:  # online training's own rollouts: the leakage guard checks them too
        inputs["online_episodes"] = trained["online_episodes"]
    # plugged-in loop types' fitted states (e.g. a confidence head), sealed into the plan
    inputs.update({k: v for k, v in rollouts.items() if k in state_artifacts()})
    return _timed("evaluate", evaluate_task, run_dir, cfg, inputs, force)


@flow(name="analyze", flow_run_name=flow_run_namer("analyze"))
def analyze_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
                 trained: dict[str, ArtifactRef], evaluated: dict[str, ArtifactRef], force: bool = False
                 ) -> dict[str, Any]:
    """P1 (harness ceiling minus mismatch, R^2 of the predictors, log-odds check, per-step mismatch)
    and P4 (zero-advantage groups, harness-identity leakage, action JSD); tables, figures, report."""
    inputs = {"tasks": frozen["tasks"], "harnesses": frozen["harnesses"], "episodes": rollouts["episodes"],
              "turns": rollouts["turns"], "train_steps": trained["train_steps"],
              "checkpoints": trained["checkpoints"], **evaluated}
    # plugged-in loop types' fitted states (an application's section of the report reads them)
    inputs.update({k: v for k, v in rollouts.items() if k in state_artifacts()})
    return _timed("analyze", analyze_task, run_dir, cfg, inputs, force)


# Tables shown in the Prefect UI (artifact key suffix -> (stage, artifact name, description)).
UI_TABLES = {
    "eval-cells": ("evaluate", "eval_cells", "sealed pass@1 per checkpoint x evaluation harness"),
    "contrasts": ("evaluate", "eval_contrasts", "pre-registered contrasts with bootstrap intervals"),
    "suite-pass-rates": ("analyze", "suite_pass_rates", "pass@1 per checkpoint x harness x suite, with intervals"),
    "training-stability": ("analyze", "training_stability", "per arm: reward, KL, stability"),
    "kl-check": ("analyze", "kl_check", "P5: gradient bias of each KL configuration (enumeration)"),
    "mismatch": ("analyze", "mismatch", "P1: ceilings and mismatch per checkpoint x harness"),
    "p1-points": ("analyze", "p1_points", "P1: C, C_soft, M, M_step, C - M, C - M_step of the base vs gain, return"),
    "predictors": ("analyze", "predictors", "P1: R^2 of each predictor with bootstrap intervals, or n/a with the reason"),
    "log-odds": ("analyze", "log_odds", "P1: log-odds check per checkpoint x harness"),
    "leakage": ("analyze", "leakage", "P4: zero-advantage groups and harness-identity leakage"),
    "action-jsd": ("analyze", "action_jsd", "P4: action-distribution JSD (bits)"),
    "step-failures": ("analyze", "step_failures", "P6: agent steps per solved / failed attempt, failure modes"),
}
# Inline figures larger than this stay file references in the UI's report (bytes of PNG).
MAX_INLINE_PNG = 1024 * 1024


@flow(name="report-tables", flow_run_name=flow_run_namer("report-tables"))
def report_tables_flow(run_dir: str, report_link: str | None = None, label: str | None = None) -> list[str]:
    """The analysis tables as table artifacts (``harnessrl-<table>``, each as
    :func:`tasks.analysis.ui_tables.ui_rows` lays it out: key columns first, numbers rounded,
    nothing blank; the Prefect UI renders a string cell as Markdown, so each is escaped: the
    ``*`` of an aggregate row is a star, not a bullet) and, when ``report_link``
    is given, a link artifact to it (``harnessrl-report-file``), in a subflow run of their own so
    the calling flow run's artifacts tab holds the report alone (the Prefect UI does not order a
    run's artifacts by creation). ``label`` names the subflow run (``report-tables · <label>``).
    Returns the keys."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    from schemas import ArtifactStore

    store = ArtifactStore(run_dir)
    keys = []
    for suffix, (stage, name, desc) in UI_TABLES.items():
        if store.exists(f"{stage}/{name}.parquet"):
            rows = store.rows((stage, name))
            if rows:
                create_table_artifact(table=ui_rows(name, rows), key=f"harnessrl-{suffix}", description=desc)
                keys.append(f"harnessrl-{suffix}")
    if report_link is not None:
        create_link_artifact(key="harnessrl-report-file", link=report_link, link_text="the run's report",
                             description=f"the run's report (the markdown artifact `harnessrl-report`); its file is "
                                         f"`{store.url_of('analyze/report.md')}`")
        keys.append("harnessrl-report-file")
    return keys


def artifact_page(artifact_id: Any) -> str:
    """Where a browser opens a Prefect artifact: ``<PREFECT_UI_URL>/artifacts/artifact/<id>``
    when a UI URL is configured (a server of one's own: ``PREFECT_API_URL`` or ``PREFECT_UI_URL``
    set), else the path ``/artifacts/artifact/<id>``, which resolves against whichever Prefect UI
    shows the link (the temporary server of a run is gone when the run ends; a UI started later
    on the run's Prefect home serves the same artifact ids)."""
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/') if base else ''}/artifacts/artifact/{artifact_id}"


def publish_report(run_dir: str, label: str | None = None) -> list[str]:
    """Publish the run's report to the calling flow run (the pipeline) so the Prefect UI shows it
    as the run's first (and only) artifact: ``analyze/report.md`` as the markdown artifact
    ``harnessrl-report`` with its figures inlined as data URIs
    (:func:`tasks.analysis.report.inline_figures`: no relative image path to break). The analysis
    tables and a link to the report artifact's page (:func:`artifact_page`: a browser opens it,
    where it blocks the ``file://`` URL of the report file) go to the subflow run
    ``report-tables`` (:func:`report_tables_flow`, named ``report-tables · <label>``). Returns
    every key published, the report's last. Call inside a flow run."""
    from prefect.artifacts import create_markdown_artifact

    from schemas import ArtifactStore
    from tasks.analysis.report import inline_figures

    store = ArtifactStore(run_dir)
    report_id = None
    if store.exists("analyze/report.md"):
        def png_of(rel: str) -> bytes | None:
            return store.read_bytes(f"analyze/{rel}") if store.exists(f"analyze/{rel}") else None

        markdown = inline_figures(store.read_bytes("analyze/report.md").decode(), png_of, MAX_INLINE_PNG)
        report_id = create_markdown_artifact(key="harnessrl-report", markdown=markdown,
                                             description=f"harnessrl report of {run_dir}")
    keys = report_tables_flow(run_dir, None if report_id is None else artifact_page(report_id), label)
    return keys + (["harnessrl-report"] if report_id is not None else [])
