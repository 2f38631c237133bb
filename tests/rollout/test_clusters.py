"""The rollout and evaluate stages on clusters that already exist: a ``dask scheduler`` with two
``dask worker`` processes, and a Ray head (``ray start --head``), both on 127.0.0.1 and named by
address in the config (``rollout.dask_address``, ``rollout.ray_address``). Their artifacts are
byte-identical to the serial runner's, although one worker process is SIGKILLed in the middle of
a shard (``HARNESSRL_FAULT``, once): the engine (the Dask scheduler, Ray's task retries) runs that
shard again on a live worker."""

import os
import sys
from pathlib import Path

import pytest

from schemas import ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.stage import run_evaluate
from tasks.records.freeze import freeze_tables
from tasks.rollout.stage import run_rollout
from tests.facilities import require

KILL_AT = "rollout:react-python:turn:1"  # a worker dies after sampling turn 1 of a react-python shard
ARTIFACTS = [("rollout", "episodes"), ("rollout", "turns"), ("evaluate", "evaluations"), ("evaluate", "eval_turns")]

pytestmark = pytest.mark.slow


def _cfg(model_dir, **rollout):
    return RunConfig.model_validate({
        "name": "clusters", "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 4, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.5}, "harnesses": ["direct", "react-python"],
        "policy": {"model": str(model_dir), "torch_threads": 1, "rollout_dtype": "float32"},
        "rollout": {"samples_per_task": 1, "shard_size": 1, **rollout},
        "evaluate": {"attempts": 1, "bootstrap_resamples": 100}, "analyze": {"ceiling_k": 1},
    })


def _stages(root: Path, cfg: RunConfig) -> dict[str, str]:
    """freeze -> rollout -> (the base checkpoint) -> evaluate; the SHA-256 of each artifact."""
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(root)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    refs.update(run_rollout(store, cfg, refs))
    refs["checkpoints"] = store.write("train", "checkpoints", [
        {"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "tiny"}])
    refs.update(run_evaluate(store, cfg, refs))
    return {f"{s}/{n}": store.ref(s, n).sha256 for s, n in ARTIFACTS}


@pytest.fixture(scope="module")
def serial(tiny_model_dir, tmp_path_factory):
    shas = _stages(tmp_path_factory.mktemp("serial"), _cfg(tiny_model_dir, task_runner="serial"))
    assert len(set(shas.values())) == len(ARTIFACTS)
    return shas


def _fault_env(marker: Path) -> dict[str, str]:
    return {"HARNESSRL_FAULT": KILL_AT, "HARNESSRL_FAULT_ONCE": str(marker)}


def _killed(marker: Path) -> int:
    """The pid of the worker that died at KILL_AT (from the fault's marker file)."""
    assert marker.exists(), "no worker reached the fault point: the test killed nothing"
    pid, point = marker.read_text().split()
    assert point == KILL_AT and int(pid) != os.getpid()
    return int(pid)


def test_existing_dask_cluster_matches_serial_after_a_killed_worker(tiny_model_dir, tmp_path, serial,
                                                                      prefect_harness):
    require("the dask command line", None if (Path(sys.executable).parent / "dask").exists()
            else "the 'dask' script is missing from the venv (pip install distributed)")
    from tests.clusters import start_dask

    marker = tmp_path / "killed"
    cluster = start_dask(2, _fault_env(marker))
    try:
        import distributed

        with distributed.Client(cluster.address) as client:
            before = set(client.run(os.getpid).values())
        shas = _stages(tmp_path / "run", _cfg(tiny_model_dir, task_runner="dask", dask_address=cluster.address))
        pid = _killed(marker)
        assert pid in before  # one of the two `dask worker` processes died mid-shard
        assert shas == serial
        with distributed.Client(cluster.address) as client:  # its nanny started a new one
            client.wait_for_workers(2, timeout=120)
            after = set(client.run(os.getpid).values())
        assert pid not in after
    finally:
        cluster.stop()
    assert not cluster.members()


def test_existing_ray_cluster_matches_serial_after_a_killed_worker(tiny_model_dir, tmp_path, serial,
                                                                     prefect_harness):
    require("ray", None if (Path(sys.executable).parent / "ray").exists()
            else "ray is not installed (pip install -e '.[ray]')")
    from tests.clusters import start_ray

    marker = tmp_path / "killed"
    cluster = start_ray(2, _fault_env(marker))
    try:
        shas = _stages(tmp_path / "run", _cfg(tiny_model_dir, task_runner="ray", ray_address=cluster.address))
        pid = _killed(marker)
        assert shas == serial
    finally:
        cluster.stop()
    assert not cluster.members()
