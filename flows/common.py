"""What every stage flow shares: the stage task factory and its content-hash cache key.

A stage is one Prefect task wrapped in one Prefect flow. Its cache key is the SHA-256 of the
stage name, the contract versions, the content hashes (SHA-256) of its input artifacts and the
hash of the config sections it reads: never a path, a flow-run id or a time. Results and cache
records are persisted in the run folder (``<run_dir>/.prefect``), so a rerun of the same run
finds finished stages as ``Cached`` and a deleted run folder takes its cache with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from prefect import task
from prefect.context import TaskRunContext

from schemas import CONTRACTS, ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.hashing import sha256_json

StageFn = Callable[[ArtifactStore, RunConfig, dict[str, ArtifactRef]], dict[str, ArtifactRef]]

# Config sections each stage reads (its cache key covers exactly these).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "freeze": ("suites", "split", "harnesses", "evaluate"),  # evaluate: its held-out harnesses get test records
    "rollout": ("policy", "sandbox", "rollout"),
    "train": ("policy", "train", "rollout", "sandbox"),
    "evaluate": ("policy", "sandbox", "evaluate", "rollout"),  # rollout: its fan-out shard_size
    "analyze": ("analyze",),
}


def stage_cache_key(stage: str, parameters: dict[str, Any]) -> str:
    """sha256(stage, contract versions, input SHA-256s, config-section hash)."""
    cfg: RunConfig = parameters["cfg"]
    inputs: dict[str, ArtifactRef] = parameters["inputs"]
    return sha256_json({
        "stage": stage,
        "contracts": {n: c.version for n, c in sorted(CONTRACTS.items())},
        "inputs": {k: v.sha256 for k, v in sorted(inputs.items())},
        "config": cfg.section_hash(*STAGE_SECTIONS[stage]),
    })


def stage_task(stage: str, fn: StageFn) -> Any:
    """A cached Prefect task running ``fn`` over the run's artifact store."""

    def stage_body(run_dir: str, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
        return fn(ArtifactStore(run_dir), cfg, inputs)

    def key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
        return stage_cache_key(stage, parameters)

    return task(stage_body, name=stage, cache_key_fn=key, persist_result=True, log_prints=True)


def call_stage(stage_task_: Any, run_dir: str, cfg: RunConfig, inputs: dict[str, ArtifactRef],
               force: bool) -> tuple[dict[str, ArtifactRef], str]:
    """Call a stage task with the run's result storage; returns (outputs, Prefect state name).

    ``force`` refreshes the cache (the stage runs even when a cached result exists).
    """
    storage = Path(run_dir).resolve() / ".prefect"
    t = stage_task_.with_options(result_storage=storage, refresh_cache=force)
    state = t(run_dir, cfg, inputs, return_state=True)
    return state.result(), state.name
