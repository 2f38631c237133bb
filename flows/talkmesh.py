"""P3 (TalkMesh) as a Prefect flow: freeze (the pipeline's cached stage) -> the TalkMesh run
(one Prefect task; see :mod:`tasks.talkmesh.run`)."""

from __future__ import annotations

from typing import Any

from prefect import flow, task

from flows.naming import flow_run_namer
from flows.stages import freeze_then
from schemas import ArtifactRef, ArtifactStore
from tasks.talkmesh.config import TalkMeshRunConfig


@task(name="talkmesh", persist_result=False, log_prints=True)
def talkmesh_task(run_dir: str, cfg: TalkMeshRunConfig, frozen: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """:func:`tasks.talkmesh.run.run_talkmesh` with the run's policy engine (base, then with the
    trained talk adapter)."""
    from tasks.rollout.engines import load_policy
    from tasks.talkmesh.run import run_talkmesh

    return run_talkmesh(ArtifactStore(run_dir), cfg, frozen, lambda adapter: load_policy(cfg, adapter))


@flow(name="harnessrl-talkmesh", flow_run_name=flow_run_namer())
def talkmesh_flow(cfg: TalkMeshRunConfig, run_dir: str, force_freeze: bool = False) -> dict[str, Any]:
    """Freeze (cached by content like the pipeline's), then the TalkMesh task. Returns
    ``{"freeze": refs, "talkmesh": refs, "seconds": wall-clock seconds of the TalkMesh task}``."""
    return freeze_then("talkmesh", talkmesh_task, run_dir, cfg, force_freeze)
