"""The pipeline: one Prefect flow chaining the five stage flows. The DAG and nothing else."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.stages import analyze_flow, evaluate_flow, freeze_flow, rollout_flow, train_flow
from tasks.config import STAGES, RunConfig


def forced(from_stage: str | None) -> dict[str, bool]:
    """Which stages ``--from STAGE`` forces: that stage and every stage after it.

    Raises ValueError for an unknown stage name."""
    if from_stage is None:
        return {s: False for s in STAGES}
    if from_stage not in STAGES:
        raise ValueError(f"--from {from_stage!r}: not a stage; stages are {', '.join(STAGES)}")
    i = STAGES.index(from_stage)
    return {s: j >= i for j, s in enumerate(STAGES)}


@flow(name="harnessrl-pipeline")
def pipeline(cfg: RunConfig, run_dir: str, from_stage: str | None = None) -> dict[str, Any]:
    """freeze -> rollout -> train -> evaluate -> analyze, each stage cached by its inputs' content
    hashes and its config; ``from_stage`` forces that stage and the ones after it."""
    force = forced(from_stage)
    frozen = freeze_flow(run_dir, cfg, force=force["freeze"])
    rollouts = rollout_flow(run_dir, cfg, frozen["outputs"], force=force["rollout"])
    trained = train_flow(run_dir, cfg, frozen["outputs"], rollouts["outputs"], force=force["train"])
    evaluated = evaluate_flow(run_dir, cfg, frozen["outputs"], rollouts["outputs"], trained["outputs"],
                              force=force["evaluate"])
    analysis = analyze_flow(run_dir, cfg, rollouts["outputs"], trained["outputs"], evaluated["outputs"],
                            force=force["analyze"])
    return {"freeze": frozen, "rollout": rollouts, "train": trained, "evaluate": evaluated, "analyze": analysis}
