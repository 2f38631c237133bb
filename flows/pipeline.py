"""The pipeline: one Prefect flow chaining the five stage flows (then the report's
``report-tables`` subflow: six subflow runs in all). The DAG and nothing else."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.naming import PIPELINE_FLOW, flow_run_namer, run_label
from flows.stages import publish_report, analyze_flow, evaluate_flow, freeze_flow, rollout_flow, train_flow
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


@flow(name=PIPELINE_FLOW, flow_run_name=flow_run_namer())
def pipeline(cfg: RunConfig, run_dir: str, from_stage: str | None = None) -> dict[str, Any]:
    """freeze -> rollout -> train -> evaluate -> analyze, each stage cached by its inputs' content
    hashes and its config; ``from_stage`` forces that stage and the ones after it. The flow of
    ``harnessrl run``; a deployment's runs are of the same flow (:func:`flows.deploy.run_config`)."""
    return chain(cfg, run_dir, from_stage)


@flow(name="harnessrl-train", flow_run_name=flow_run_namer())
def through_train(cfg: RunConfig, run_dir: str, from_stage: str | None = None) -> dict[str, Any]:
    """freeze -> rollout -> train (``harnessrl train`` under torchrun: the train stage is
    data-parallel over the torchrun processes), cached like :func:`pipeline`."""
    return chain(cfg, run_dir, from_stage, until="train")


def chain(cfg: RunConfig, run_dir: str, from_stage: str | None = None, until: str | None = None) -> dict[str, Any]:
    """The stage flows in order (call inside a flow): every stage up to and including ``until``
    (None: all five). Returns ``{stage: {"outputs", "state", "seconds"}}`` for the stages run.

    Raises ValueError for an unknown ``from_stage`` or ``until``."""
    from flows.stopping import note_flow_run

    note_flow_run()  # a stop (SIGTERM, SIGINT) marks this flow run Cancelled
    force = forced(from_stage)
    if until is not None and until not in STAGES:
        raise ValueError(f"until={until!r}: not a stage; stages are {', '.join(STAGES)}")
    last = STAGES.index(until) if until else len(STAGES) - 1
    out: dict[str, Any] = {}
    out["freeze"] = freeze_flow(run_dir, cfg, force=force["freeze"])
    if last >= 1:
        out["rollout"] = rollout_flow(run_dir, cfg, out["freeze"]["outputs"], force=force["rollout"])
    if last >= 2:
        out["train"] = train_flow(run_dir, cfg, out["freeze"]["outputs"], out["rollout"]["outputs"],
                                  force=force["train"])
    if last >= 3:
        out["evaluate"] = evaluate_flow(run_dir, cfg, out["freeze"]["outputs"], out["rollout"]["outputs"],
                                        out["train"]["outputs"], force=force["evaluate"])
    if last >= 4:
        out["analyze"] = analyze_flow(run_dir, cfg, out["freeze"]["outputs"], out["rollout"]["outputs"],
                                      out["train"]["outputs"], out["evaluate"]["outputs"], force=force["analyze"])
        publish_report(run_dir, label=run_label(cfg))
    log = get_run_logger()
    for stage, r in out.items():
        log.info("stage %s: %s in %.1f s (%s)", stage, r["state"], r["seconds"],
                 ", ".join(f"{k} {v.rows} rows" for k, v in r["outputs"].items()))
    return out
