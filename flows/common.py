"""What every stage flow shares: the stage task factory and its content-hash cache key.

A stage is one Prefect task wrapped in one Prefect flow. Its cache key is the SHA-256 of the
stage name, the contract versions, the content hashes (SHA-256) of its input artifacts and the
hash of the config sections it reads: never a path, a flow-run id or a time. Results and cache
records are persisted in the run folder (``<run_dir>/.prefect``), so a rerun of the same run
finds finished stages as ``Cached`` and a deleted run folder takes its cache with it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from prefect import task
from prefect.context import TaskRunContext

from schemas import CONTRACTS, ArtifactRef, ArtifactStore
from schemas.contracts import PIPELINE_CONTRACTS
from schemas.faults import fault_point
from flows import stopping
from flows.cache import check_cached_result
from flows.status import STATE_DIR
from tasks.config import RunConfig
from tasks.hashing import sha256_json

StageFn = Callable[[ArtifactStore, RunConfig, dict[str, ArtifactRef]], dict[str, ArtifactRef]]

# Config sections each stage reads (its cache key covers exactly these).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "freeze": ("suites", "split", "harnesses", "evaluate"),  # evaluate: its held-out harnesses get test records
    "rollout": ("policy", "sandbox", "rollout"),
    "train": ("policy", "train", "arms", "sweep", "rollout", "sandbox"),
    "evaluate": ("policy", "sandbox", "evaluate", "rollout"),  # rollout: its fan-out shard_size
    "analyze": ("analyze", "policy", "sandbox", "train"),  # models for log-odds and branching; train.kl.beta
}


def stage_cache_key(stage: str, parameters: dict[str, Any]) -> str:
    """sha256(stage, contract versions, input SHA-256s, config-section hash)."""
    cfg: RunConfig = parameters["cfg"]
    inputs: dict[str, ArtifactRef] = parameters["inputs"]
    return sha256_json({
        "stage": stage,
        "contracts": {n: c.version for n, c in sorted(CONTRACTS.items()) if n in PIPELINE_CONTRACTS},
        "inputs": {k: v.sha256 for k, v in sorted(inputs.items())},
        "config": cfg.section_hash(*STAGE_SECTIONS[stage]),
    })


def stage_task(stage: str, fn: StageFn) -> Any:
    """A cached Prefect task running ``fn`` over the run's artifact store."""

    def stage_body(run_dir: str, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
        stopping.note_task_run()  # a stop (SIGTERM, SIGINT) marks this task run Cancelled
        fault_point(f"task:{stage}")
        return fn(ArtifactStore(run_dir), cfg, inputs)

    def key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
        return stage_cache_key(stage, parameters)

    return task(stage_body, name=stage, cache_key_fn=key, persist_result=True, log_prints=True)


def call_stage(stage_task_: Any, run_dir: str, cfg: RunConfig, inputs: dict[str, ArtifactRef],
               force: bool) -> tuple[dict[str, ArtifactRef], str]:
    """Call a stage task with the run's result storage; returns (outputs, Prefect state name).

    ``force`` refreshes the cache (the stage runs even when a cached result exists). Without it,
    a cached result counts only when every artifact it names still matches (SHA-256 and rows,
    :func:`flows.cache.check_cached_result`); otherwise the stage runs again.

    Raises:
        flows.cache.StaleCacheError: a sealed stage's (evaluate) cached artifact changed on disk;
            the stage's record is left as it was (``harnessrl status`` shows it ``corrupt``).
    """
    stage = stage_task_.name
    store = ArtifactStore(run_dir)
    fault_point(f"before:{stage}")
    stray = store.remove_stray_temp_files(stage)
    if stray:
        logging.getLogger("harnessrl.flows").warning("%s: removed %d temp file(s) of an interrupted write: %s",
                                                     stage, len(stray), ", ".join(stray))
    storage = result_storage(store)
    if not force:
        force = check_cached_result(store, stage, storage, stage_cache_key(stage, {"cfg": cfg, "inputs": inputs}))
    started = _now()
    try:
        earlier = store.read_json(stage_state_path(stage)) if store.exists(stage_state_path(stage)) else {}
    except (ValueError, OSError):  # a record cut by a crash: nothing to carry over
        earlier = {}
    record = {"stage": stage, "state": "Running", "pid": os.getpid(), "host": socket.gethostname(),
              "started_at": started, "finished_at": None, "seconds": None, "error": None}
    store.write_json(stage_state_path(stage), record)
    stopping.note_flow_run()
    stopping.note_stage(store.url, stage, record)
    t = stage_task_.with_options(result_storage=storage, refresh_cache=force)
    t0 = time.perf_counter()
    try:
        state = t(run_dir, cfg, inputs, return_state=True)
    except BaseException as e:  # a stop (SIGTERM, SIGINT) unwinding: the record says Cancelled
        if stopping.is_stop(e):
            stopping.write_cancelled_stage(stopping.REGISTRY.signum or getattr(e, "signal", None))
        raise
    stopping.note_stage(None)
    record.update(finished_at=_now(), seconds=round(time.perf_counter() - t0, 3), state=state.name)
    # the seconds the stage last computed (a cache hit keeps the earlier figure): a run's wall time
    if state.name == "Cached":
        record["compute_seconds"] = earlier.get("compute_seconds")
    else:
        record["compute_seconds"] = record["seconds"]
    try:
        outputs = state.result()
    except BaseException as e:
        record.update(state="Failed", error=f"{type(e).__name__}: {e}"[:2000])
        store.write_json(stage_state_path(stage), record)
        raise
    store.write_json(stage_state_path(stage), record)
    fault_point(f"after:{stage}")
    return outputs, state.name


def result_storage(store: ArtifactStore) -> Any:
    """Where Prefect persists stage results and cache records: ``<run>/.prefect`` on the store's
    filesystem (a local path, or a Prefect ``RemoteFileSystem`` on the same fsspec URL)."""
    if store.is_local:
        return Path(store.root).resolve() / ".prefect"
    from prefect.filesystems import RemoteFileSystem

    # Prefect needs result storage saved server-side: one block per run URL, named by its hash.
    # Credentials stay in the environment (AWS_* etc.); the block holds only the URL and any
    # non-secret storage options the store was given.
    basepath = f"{store.url.rstrip('/')}/.prefect"
    name = f"harnessrl-results-{sha256_json(basepath)[:16]}"
    RemoteFileSystem(basepath=basepath, settings=dict(store.storage_options)).save(name, overwrite=True)
    return f"remote-file-system/{name}"


def stage_state_path(stage: str) -> str:
    """Store path of a stage's last-run record (JSON: stage, state Running|Completed|Cached|Failed|Cancelled,
    pid, host, started_at/finished_at (UTC ISO 8601), seconds, compute_seconds (the seconds of the
    stage's last run that was not a cache hit), error), read by ``harnessrl status``."""
    return f"{STATE_DIR}/{stage}.json"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()
