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
    return _timed("evaluate", evaluate_task, run_dir, cfg, inputs, force)


@flow(name="analyze")
def analyze_flow(run_dir: str, cfg: RunConfig, rollouts: dict[str, ArtifactRef], trained: dict[str, ArtifactRef],
                 evaluated: dict[str, ArtifactRef], force: bool = False) -> dict[str, Any]:
    """Harness ceiling minus mismatch per checkpoint and harness; a table and a report."""
    inputs = {"episodes": rollouts["episodes"], "train_steps": trained["train_steps"], **evaluated}
    return _timed("analyze", analyze_task, run_dir, cfg, inputs, force)


def publish_report(run_dir: str) -> None:
    """The run's ``analyze/report.md`` as a Prefect markdown artifact (key ``harnessrl-report``) of
    the calling flow run (the pipeline), so the UI shows it there. Call inside a flow run."""
    from prefect.artifacts import create_markdown_artifact

    from schemas import ArtifactStore

    store = ArtifactStore(run_dir)
    if store.exists("analyze/report.md"):
        create_markdown_artifact(key="harnessrl-report", markdown=store.read_bytes("analyze/report.md").decode(),
                                 description=f"harnessrl report of {run_dir}")
