"""One Prefect flow per stage. Each reads like its line in DESIGN.md; the logic is in tasks/."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from flows.common import call_stage, stage_task
from schemas import ArtifactRef
from tasks.analysis.stage import run_analyze
from tasks.config import RunConfig
from tasks.evaluate.stage import run_evaluate
from tasks.records.stage import run_freeze
from tasks.rollout.stage import run_rollout
from tasks.train.stage import run_train

freeze_task = stage_task("freeze", run_freeze)
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


@flow(name="freeze")
def freeze_flow(run_dir: str, cfg: RunConfig, force: bool = False) -> dict[str, Any]:
    """Task suites x harness specs become content-addressed, split, frozen task-harness records."""
    return _timed("freeze", freeze_task, run_dir, cfg, {}, force)


@flow(name="rollout")
def rollout_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], force: bool = False) -> dict[str, Any]:
    """The base policy runs through each harness on each train task; every turn, token and log-prob is kept."""
    return _timed("rollout", rollout_task, run_dir, cfg, frozen, force)


@flow(name="train")
def train_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
               force: bool = False) -> dict[str, Any]:
    """GRPO/GSPO on a LoRA adapter over the rollouts; a checkpoint and per-step metrics come out."""
    inputs = {"tasks": frozen["tasks"], "harnesses": frozen["harnesses"], "records": frozen["records"], **rollouts}
    return _timed("train", train_task, run_dir, cfg, inputs, force)


@flow(name="evaluate")
def evaluate_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
                  trained: dict[str, ArtifactRef], force: bool = False) -> dict[str, Any]:
    """Held-out tasks x evaluation harnesses x checkpoints, under a plan sealed before the first attempt."""
    inputs = {**frozen, "episodes": rollouts["episodes"], "checkpoints": trained["checkpoints"]}
    if "online_episodes" in trained:  # online training's own rollouts: the leakage guard checks them too
        inputs["online_episodes"] = trained["online_episodes"]
    if "talkmesh_head" in rollouts:  # talkmesh harnesses: the confidence head, sealed into the plan
        inputs["talkmesh_head"] = rollouts["talkmesh_head"]
    return _timed("evaluate", evaluate_task, run_dir, cfg, inputs, force)


@flow(name="analyze")
def analyze_flow(run_dir: str, cfg: RunConfig, frozen: dict[str, ArtifactRef], rollouts: dict[str, ArtifactRef],
                 trained: dict[str, ArtifactRef], evaluated: dict[str, ArtifactRef], force: bool = False
                 ) -> dict[str, Any]:
    """P1 (harness ceiling minus mismatch, R^2 of the predictors, log-odds check, per-step mismatch)
    and P4 (zero-advantage groups, harness-identity leakage, action JSD); tables, figures, report."""
    inputs = {"tasks": frozen["tasks"], "harnesses": frozen["harnesses"], "episodes": rollouts["episodes"],
              "turns": rollouts["turns"], "train_steps": trained["train_steps"],
              "checkpoints": trained["checkpoints"], **evaluated}
    if "talkmesh_head" in rollouts:  # the TalkMesh section of the report
        inputs["talkmesh_head"] = rollouts["talkmesh_head"]
    return _timed("analyze", analyze_task, run_dir, cfg, inputs, force)


# Tables shown in the Prefect UI (artifact key suffix -> (stage, artifact name, description)).
UI_TABLES = {
    "eval-cells": ("evaluate", "eval_cells", "sealed pass@1 per checkpoint x evaluation harness"),
    "contrasts": ("evaluate", "eval_contrasts", "pre-registered contrasts with bootstrap intervals"),
    "suite-pass-rates": ("analyze", "suite_pass_rates", "pass@1 per checkpoint x harness x suite, with intervals"),
    "training-stability": ("analyze", "training_stability", "per arm: reward, KL, stability"),
    "kl-check": ("analyze", "kl_check", "P5: gradient bias of each KL configuration (enumeration)"),
    "mismatch": ("analyze", "mismatch", "P1: ceilings and mismatch per checkpoint x harness"),
    "predictors": ("analyze", "predictors", "P1: R^2 of C, M and C - M with bootstrap intervals"),
    "log-odds": ("analyze", "log_odds", "P1: log-odds check per checkpoint x harness"),
    "leakage": ("analyze", "leakage", "P4: zero-advantage groups and harness-identity leakage"),
    "action-jsd": ("analyze", "action_jsd", "P4: action-distribution JSD (bits)"),
}
# Inline images larger than this are published as links only (bytes of PNG).
MAX_INLINE_PNG = 512 * 1024


def publish_report(run_dir: str) -> list[str]:
    """Publish the run's report to the calling flow run (the pipeline) so the Prefect UI shows it:
    ``analyze/report.md`` as a markdown artifact (key ``harnessrl-report``), the analysis tables as
    table artifacts (``harnessrl-<table>``), each figure as an image artifact (inline PNG data URL,
    key ``harnessrl-plot-<name>``) and a link artifact to its file in the run folder. Returns the
    keys published. Call inside a flow run."""
    import base64

    from prefect.artifacts import (create_image_artifact, create_link_artifact, create_markdown_artifact,
                                   create_table_artifact)

    from schemas import ArtifactStore

    store = ArtifactStore(run_dir)
    keys = []
    if store.exists("analyze/report.md"):
        create_markdown_artifact(key="harnessrl-report", markdown=store.read_bytes("analyze/report.md").decode(),
                                 description=f"harnessrl report of {run_dir}")
        keys.append("harnessrl-report")
    for suffix, (stage, name, desc) in UI_TABLES.items():
        if store.exists(f"{stage}/{name}.parquet"):
            rows = store.rows((stage, name))
            if rows:
                create_table_artifact(table=rows, key=f"harnessrl-{suffix}", description=desc)
                keys.append(f"harnessrl-{suffix}")
    plots = [p.rsplit("/", 1)[-1] for p in store.list_files("analyze/plots") if p.endswith(".png")]
    for fname in plots:
        rel = f"analyze/plots/{fname}"
        slug = fname[:-4].replace("_", "-")
        url = store.url_of(rel)
        create_link_artifact(key=f"harnessrl-plot-{slug}-file", link=url, link_text=fname,
                             description=f"figure {fname} of {run_dir}")
        keys.append(f"harnessrl-plot-{slug}-file")
        png = store.read_bytes(rel)
        if len(png) <= MAX_INLINE_PNG:
            create_image_artifact(key=f"harnessrl-plot-{slug}",
                                  image_url="data:image/png;base64," + base64.b64encode(png).decode(),
                                  description=f"figure {fname}")
            keys.append(f"harnessrl-plot-{slug}")
    return keys
