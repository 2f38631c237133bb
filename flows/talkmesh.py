"""P3 (TalkMesh) as a Prefect flow: freeze (the pipeline's cached stage) -> the TalkMesh run
(one Prefect task; see :mod:`tasks.talkmesh.run`)."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task

from flows.common import call_stage
from flows.stages import freeze_task
from schemas import ArtifactRef, ArtifactStore
from tasks.talkmesh.config import TalkMeshRunConfig


@task(name="talkmesh", persist_result=False, log_prints=True)
def talkmesh_task(run_dir: str, cfg: TalkMeshRunConfig, frozen: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """:func:`tasks.talkmesh.run.run_talkmesh` with the run's policy engine (base, then with the
    trained talk adapter)."""
    from tasks.rollout.stage import load_policy
    from tasks.talkmesh.run import run_talkmesh

    return run_talkmesh(ArtifactStore(run_dir), cfg, frozen, lambda adapter: load_policy(cfg, adapter))


@flow(name="harnessrl-talkmesh")
def talkmesh_flow(cfg: TalkMeshRunConfig, run_dir: str, force_freeze: bool = False) -> dict[str, Any]:
    """Freeze (cached by content like the pipeline's), then the TalkMesh task. Returns
    ``{"freeze": refs, "talkmesh": refs, "seconds": wall-clock seconds of the TalkMesh task}``."""
    frozen, _ = call_stage(freeze_task, run_dir, cfg, {}, force_freeze)
    t0 = time.perf_counter()
    refs = talkmesh_task(run_dir, cfg, frozen)
    seconds = time.perf_counter() - t0
    get_run_logger().info("talkmesh: %.1f s -> %s", seconds, ", ".join(f"{k} ({v.rows} rows)" for k, v in refs.items()))
    return {"freeze": frozen, "talkmesh": refs, "seconds": seconds}
