"""Fan-out of rollout episodes: shard layout, runners (serial, Prefect threads, a real 2-process
Dask cluster) giving identical rows, and a failing shard named in the error."""

import json

import pytest

from tasks.config import RunConfig
from tasks.harnesses.spec import HarnessSpec
from tasks.hashing import canonical_json, seed_from
from tasks.records.freeze import freeze_tables
from tasks.rollout.fanout import PolicySource, ShardError, _task_runner, plan_shards
from tasks.rollout.runner import run_records

SAMPLES, SEED, TAG = 2, 7, "t"


def _cfg(model_dir, **rollout):
    return RunConfig.model_validate({
        "name": "fanout", "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 3, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "harnesses": ["direct", "react-python"],
        "policy": {"model": str(model_dir), "batch_size": 64, "torch_threads": 1, "rollout_dtype": "float32"},
        "rollout": {"samples_per_task": SAMPLES, **rollout},
    })


@pytest.fixture(scope="module")
def frozen(tiny_model_dir):
    tasks, harnesses, records = freeze_tables(_cfg(tiny_model_dir))
    specs = {}
    for h in harnesses:  # 12-token turns keep the tiny model's episodes cheap; react-python still runs 3 turns
        spec = HarnessSpec.model_validate(json.loads(h["spec_json"]))
        specs[h["harness_id"]] = spec.model_copy(update={"sampling": spec.sampling.model_copy(
            update={"max_new_tokens": 12})})
    return {t["task_id"]: t for t in tasks}, specs, records


def _run(tiny_model_dir, frozen, tasks=None, **rollout):
    cfg = _cfg(tiny_model_dir, **rollout)
    all_tasks, specs, records = frozen
    return run_records(PolicySource.of(cfg), cfg, specs, tasks or all_tasks, records, SAMPLES, SEED, TAG)


def _bytes(rows):
    # turn_times, tool_calls: wall-clock seconds of the engine and tool calls, different in every run
    return canonical_json([{k: v for k, v in r.items() if k not in ("record", "turn_times", "tool_calls")} for r in rows])


@pytest.fixture(scope="module")
def serial_sharded(tiny_model_dir, frozen):
    return _run(tiny_model_dir, frozen, task_runner="serial", shard_size=4)


def test_plan_shards_by_harness_then_whole_records(frozen):
    _, specs, records = frozen
    shards = plan_shards(records, specs, samples=2, shard_size=5)  # 5 // 2 = 2 records a shard
    assert [s.harness_name for s in shards] == ["direct"] * 2 + ["react-python"] * 2
    assert [len(s.record_ids) for s in shards] == [2, 1, 2, 1] and [s.index for s in shards] == [0, 1, 2, 3]
    for name in ("direct", "react-python"):
        ids = [i for s in shards if s.harness_name == name for i in s.record_ids]
        assert ids == sorted(r["record_id"] for r in records if r["harness_name"] == name)
    assert [len(s.record_ids) for s in plan_shards(records, specs, samples=4, shard_size=3)] == [1] * 6  # never split
    assert [s.episodes for s in plan_shards(records, specs, samples=3, shard_size=None)] == [9, 9]
    assert "shard 2/4 (harness direct, 1 record " in shards[1].label


def test_serial_unsharded_is_the_engine_called_once_per_harness(tiny_model_dir, frozen):
    """shard_size unset: the rows of the pre-fan-out loop (one run_episodes call per harness)."""
    from tasks.rollout.fanout import episode_jobs
    from tasks.rollout.harness import run_episodes

    tasks, specs, records = frozen
    cfg = _cfg(tiny_model_dir)
    policy = PolicySource.of(cfg).load()
    want_eps, want_turns = [], []
    for hid in sorted(specs, key=lambda h: specs[h].name):
        recs = sorted((r for r in records if r["harness_id"] == hid), key=lambda r: r["record_id"])
        jobs = episode_jobs(recs, tasks, SAMPLES, SEED, TAG, policy.policy_id)
        eps, turns = run_episodes(policy, specs[hid], jobs, cfg.sandbox, seed=seed_from(SEED, TAG, hid))
        want_eps += eps
        want_turns += turns
    eps, turns = run_records(policy, cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"task_runner": "serial"})}), specs, tasks, records, SAMPLES, SEED, TAG)
    assert [e["episode_id"] for e in eps] == [e["episode_id"] for e in want_eps]
    assert _bytes(eps) == _bytes([dict(e, sample_idx=e2["sample_idx"], seed=e2["seed"], policy_id=policy.policy_id)
                                  for e, e2 in zip(want_eps, eps)])
    assert _bytes(turns) == _bytes(want_turns)
    assert len({t["episode_id"] for t in turns}) == len(records) * SAMPLES
    assert max(e["num_turns"] for e in eps) > 1  # react-python ran several turns for some episodes


def test_thread_runner_matches_serial(tiny_model_dir, frozen, serial_sharded, prefect_harness):
    eps, turns = _run(tiny_model_dir, frozen, task_runner="thread", workers=2, shard_size=4)
    assert _bytes(eps) == _bytes(serial_sharded[0]) and _bytes(turns) == _bytes(serial_sharded[1])
    assert [e["record"]["record_id"] for e in eps] == [e["record"]["record_id"] for e in serial_sharded[0]]


def test_the_thread_runner_reports_progress_turn_by_turn(tiny_model_dir, frozen, prefect_harness, monkeypatch):
    """The bar counts turn slots (max_turns per episode) and moves within a shard, not only when
    a shard ends: more advances than shards, adding up to exactly every episode's slots."""
    import contextlib

    import tasks.progress

    calls: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def recording(desc, total, unit="items", log_every_s=10.0):
        calls.append((desc, total))
        yield lambda n=1: calls.append(("advance", n))

    monkeypatch.setattr(tasks.progress, "progress", recording)
    _, specs, records = frozen
    eps, _ = _run(tiny_model_dir, frozen, task_runner="thread", workers=1)  # one shard per harness
    slots = sum(SAMPLES * specs[r["harness_id"]].max_turns for r in records)
    assert calls[0] == (f"{TAG}: {len(eps)} episodes", slots)
    advances = [n for what, n in calls[1:] if what == "advance"]
    assert sum(advances) == slots
    assert sum(1 for n in advances if n > 0) > 2  # 2 shards: a per-shard bar would advance twice


@pytest.fixture(scope="module")
def dask_cluster():
    """A real local Dask cluster of 2 worker processes, made the default client so that the
    fan-out's DaskTaskRunner connects to it (one start for the tests below)."""
    import distributed
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            distributed.Client(cl) as client:
        yield client


def test_dask_runner_on_two_processes_matches_serial(tiny_model_dir, frozen, serial_sharded, prefect_harness,
                                                     dask_cluster):
    dask_cluster.run(lambda: __import__("torch").set_num_threads(2))  # not what the caller computes with
    threads = lambda: __import__("torch").get_num_threads()  # noqa: E731
    eps, turns = _run(tiny_model_dir, frozen, task_runner="dask", workers=2, shard_size=4)
    assert _bytes(eps) == _bytes(serial_sharded[0]) and _bytes(turns) == _bytes(serial_sharded[1])
    # both worker processes ran shards, and each loaded the policy once, whatever number it ran
    loads = dask_cluster.run(lambda: __import__("tasks.rollout.fanout", fromlist=["LOADS"]).LOADS[0])
    assert sorted(loads.values()) == [1, 1]
    assert set(dask_cluster.run(threads).values()) == {1}  # policy.torch_threads, pinned in every worker


def test_shards_run_with_the_callers_torch_thread_count(tiny_model_dir):
    """Thread count changes CPU reduction order (bf16 log-probs differ between 1 and 2 threads):
    without policy.torch_threads, workers copy the caller's count."""
    import torch

    from tasks.rollout.fanout import pin_torch_threads, torch_threads

    before = torch.get_num_threads()
    try:
        cfg = _cfg(tiny_model_dir)
        assert torch_threads(cfg) == 1
        unset = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"torch_threads": None})})
        pin_torch_threads(3)
        assert torch_threads(unset) == 3 == torch.get_num_threads()
    finally:
        pin_torch_threads(before)


@pytest.mark.parametrize("runner", ["thread", "dask"])
def test_a_failing_shard_is_named(tiny_model_dir, frozen, prefect_harness, runner, request):
    if runner == "dask":
        request.getfixturevalue("dask_cluster")
    tasks, specs, records = frozen
    react = sorted((r for r in records if r["harness_name"] == "react-python"), key=lambda r: r["record_id"])
    broken = dict(tasks)  # the third record's task lost its instruction: shard 2 of 2 fails, shard 1 ran
    broken[react[2]["task_id"]] = {k: v for k, v in tasks[react[2]["task_id"]].items() if k != "instruction"}
    with pytest.raises(ShardError) as e:
        _run(tiny_model_dir, (tasks, specs, react), broken, task_runner=runner, workers=2, shard_size=4)
    msg = str(e.value)
    assert "shard 2/2 (harness react-python, 1 record " in msg and react[2]["record_id"][:10] in msg
    assert f"runner {runner}" in msg and "KeyError" in msg and "instruction" in msg


def test_dask_refuses_a_policy_that_lives_only_in_this_process(tiny_model_dir, frozen):
    tasks, specs, records = frozen
    cfg = _cfg(tiny_model_dir, task_runner="dask")
    with pytest.raises(ValueError, match="needs a PolicySource"):
        run_records(object(), cfg, specs, tasks, records, SAMPLES, SEED, TAG)


def test_dask_runner_builds_a_process_cluster_of_the_configured_size(tiny_model_dir):
    r = _task_runner(_cfg(tiny_model_dir, task_runner="dask", workers=3).rollout)
    assert type(r).__name__ == "DaskTaskRunner"
    assert (r.cluster_kwargs["n_workers"], r.cluster_kwargs["threads_per_worker"], r.cluster_kwargs["processes"]) == \
        (3, 1, True)
    assert _task_runner(_cfg(tiny_model_dir, task_runner="thread", workers=5).rollout)._max_workers == 5
    existing = _task_runner(_cfg(tiny_model_dir, task_runner="dask", dask_address="tcp://127.0.0.1:8786").rollout)
    assert existing.address == "tcp://127.0.0.1:8786" and existing.cluster_class is None
    ray = _task_runner(_cfg(tiny_model_dir, task_runner="ray", workers=3).rollout)
    assert type(ray).__name__ == "RayTaskRunner" and ray.address is None and ray.init_kwargs["num_cpus"] == 3
    ray = _task_runner(_cfg(tiny_model_dir, task_runner="ray", ray_address="127.0.0.1:6379").rollout)
    assert ray.address == "127.0.0.1:6379" and "num_cpus" not in ray.init_kwargs


def test_config_runner_and_workers_stay_out_of_the_cache_key(tiny_model_dir):
    a = _cfg(tiny_model_dir)
    b = _cfg(tiny_model_dir, task_runner="dask", workers=7)
    c = _cfg(tiny_model_dir, shard_size=8)
    d = _cfg(tiny_model_dir, task_runner="ray", ray_address="ray://head:10001")
    e = _cfg(tiny_model_dir, task_runner="dask", dask_address="tcp://sched:8786")
    assert a.section_hash("rollout") == b.section_hash("rollout") == d.section_hash("rollout") == \
        e.section_hash("rollout") != c.section_hash("rollout")
    with pytest.raises(ValueError, match="rollout.dask_address='tcp://s:1' is only used by task_runner 'dask'"):
        _cfg(tiny_model_dir, task_runner="ray", dask_address="tcp://s:1")
    with pytest.raises(ValueError, match="ray_address"):
        _cfg(tiny_model_dir, task_runner="ray", ray_address="not an address")
    with pytest.raises(ValueError, match="shard_size"):
        _cfg(tiny_model_dir, shard_size=0)
    with pytest.raises(ValueError, match="task_runner"):
        _cfg(tiny_model_dir, task_runner="spark")
    for runner in ("dask", "ray"):
        with pytest.raises(ValueError, match="in-memory policy"):
            RunConfig.model_validate({**_cfg(tiny_model_dir).model_dump(), "train": {"mode": "online", "steps": 1},
                                      "rollout": {"task_runner": runner}})
