"""P2 (BiPA) as a Prefect flow: freeze (the pipeline's cached stage) -> the skill optimizer, its
acceptance-rule replay, the episode graph and the report (one Prefect task; see
:mod:`tasks.bipa.optimizer`)."""

from __future__ import annotations

from typing import Any

from prefect import flow, task

from flows.naming import flow_run_namer
from flows.stages import freeze_then
from schemas import ArtifactRef, ArtifactStore
from tasks.bipa.config import BipaRunConfig


@task(name="bipa", persist_result=False, log_prints=True)
def bipa_task(run_dir: str, cfg: BipaRunConfig, frozen: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Load the policy (and the proposer, when ``bipa.proposer`` names another engine), run
    :func:`tasks.bipa.optimizer.run_bipa`, and close the engines."""
    from tasks.bipa.optimizer import run_bipa
    from tasks.rollout.engines import close_policy, load_policy

    policy = load_policy(cfg)
    proposer = None
    try:
        if cfg.bipa.proposer is not None:
            proposer = load_policy(cfg.model_copy(update={"policy": cfg.bipa.proposer}))
        return run_bipa(ArtifactStore(run_dir), cfg, frozen, policy, proposer)
    finally:
        close_policy(policy)
        if proposer is not None:
            close_policy(proposer)


@flow(name="harnessrl-bipa", flow_run_name=flow_run_namer())
def bipa_flow(cfg: BipaRunConfig, run_dir: str, force_freeze: bool = False) -> dict[str, Any]:
    """Freeze (cached by content like the pipeline's), then the BiPA task. Returns
    ``{"freeze": refs, "bipa": refs, "seconds": wall-clock seconds of the BiPA task}``."""
    return freeze_then("bipa", bipa_task, run_dir, cfg, force_freeze)
