"""Running records: ``samples`` episodes per (record, harness) with one policy, fanned out over the
configured task runner, and the ``episodes`` rows they make. The rollout, train (online arms) and
evaluate stages, BiPA and the benchmarks all sample through here."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from tasks.config import RunConfig
from tasks.harnesses.spec import HarnessSpec
from tasks.rollout.groups import group_ids

log = logging.getLogger("harnessrl.rollout")


def run_records(policy: Any, cfg: RunConfig, specs: dict[str, HarnessSpec], tasks: dict[str, dict[str, Any]],
                records: list[dict[str, Any]], samples: int, seed: int, tag: str, *,
                loop_states: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``samples`` episodes per record under its harness, fanned out over ``cfg.rollout``'s task
    runner (see :mod:`tasks.rollout.fanout`): :func:`iter_records` with its chunks joined.

    Returns:
        ``(episodes, turns)``: episode dicts as ``run_episodes`` makes them plus ``record``,
        ``sample_idx``, ``seed`` and ``policy_id``, in (harness name, record id, sample) order;
        turn rows in the same episode order. Episode ids are content hashes of (record, tag,
        policy, sample index, seed). The rows do not depend on ``task_runner`` or ``workers``.

    Raises: see :func:`iter_records`.
    """
    episodes: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for eps, ts in iter_records(policy, cfg, specs, tasks, records, samples, seed, tag, loop_states=loop_states):
        episodes += eps
        turns += ts
    return episodes, turns


def iter_records(policy: Any, cfg: RunConfig, specs: dict[str, HarnessSpec], tasks: dict[str, dict[str, Any]],
                 records: list[dict[str, Any]], samples: int, seed: int, tag: str, *,
                 loop_states: dict[str, Any] | None = None
                 ) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Run ``samples`` episodes per record under its harness and yield ``(episodes, turns)`` one
    chunk at a time, in (harness name, record id, sample) order: one chunk per shard of
    :mod:`tasks.rollout.fanout` (on every runner), and one per harness of a plugged-in loop type
    (:mod:`tasks.rollout.loop_plugins`, e.g. ``talkmesh``), whose records its plugin runs in this
    process with the harness's fitted state from ``loop_states`` (harness_id -> state).
    A caller that writes each chunk before asking for the next holds one shard's turns at a time.

    Args:
        policy: a :class:`tasks.rollout.fanout.PolicySource` (any runner; each process loads it
            once) or a loaded policy object (runners ``serial`` and ``thread`` only).
        samples: episodes per record; ``seed``: the call's seed; ``tag``: names the call
            (``rollout``, ``eval:<checkpoint>``, ...) in episode ids and seeds.

    Yields:
        ``(episodes, turns)`` as :func:`run_records` returns them, for the chunk's episodes.

    Raises:
        tasks.rollout.fanout.ShardError: a shard failed (the message names it).
        tasks.environments.sandbox.limits.HostLimitError: the hard RLIMIT_NOFILE cannot hold the
            sandboxes the plan opens at once in this process (raised before any episode runs).
        ValueError: a policy object with the ``dask`` or ``ray`` runner; or a shard's episodes
            came back in another order than its jobs (an engine contract violation); a harness of
            a plugged-in loop type with no state in ``loop_states``.
    """
    from tasks.rollout.fanout import (PolicySource, ShardInput, cached_policy, iter_fan_out, pin_torch_threads,
                                      plan_shards, release_policy, torch_threads)
    from tasks.rollout.loop_plugins import plugin_of

    plugin_ids = {r["harness_id"] for r in records if r["harness_id"] in specs and plugin_of(specs[r["harness_id"]])}
    missing = sorted(specs[h].name for h in plugin_ids if h not in (loop_states or {}))
    if missing:
        raise ValueError(f"{tag}: harness(es) {missing} of a plugged-in loop type have no fitted state in loop_states "
                         "(the rollout stage writes it as the plugin's state_artifact)")
    rc = cfg.rollout
    threads = torch_threads(cfg)
    plain = [r for r in records if r["harness_id"] not in plugin_ids]
    by_id = {r["record_id"]: r for r in plain}
    shards = plan_shards(plain, specs, samples, rc.shard_size) if plain else []
    inputs = []
    for sh in shards:
        recs = [by_id[i] for i in sh.record_ids]
        inputs.append(ShardInput(sh, specs[sh.harness_id], recs, {r["task_id"]: tasks[r["task_id"]] for r in recs},
                                 seed, tag, cfg.sandbox, threads))
    # every sandbox of a shard is open at once: make room for the plan's descriptors in this
    # process (worker processes of dask/ray check their own shard in run_shard) or refuse now
    from tasks.environments.sandbox.limits import ensure_descriptors, episode_sandboxes, planned_sandboxes

    per_shard = [episode_sandboxes(i.spec, [i.tasks[r["task_id"]] for r in i.records], samples) for i in inputs]
    ensure_descriptors(planned_sandboxes(per_shard, rc.task_runner, rc.workers), cfg.sandbox.backend, tag)
    results = iter_fan_out(inputs, policy, rc)  # lazy: nothing runs before the first next()
    pending = list(inputs)  # in harness-name order, as hids below
    hids = sorted({r["harness_id"] for r in records}, key=lambda h: (specs[h].name, h))
    try:
        for hid in hids:
            if hid in plugin_ids:
                pin_torch_threads(threads)  # as run_shard does: the thread count changes CPU reduction order
                loaded = cached_policy(policy) if isinstance(policy, PolicySource) else policy
                plugin = plugin_of(specs[hid])
                assert plugin is not None
                yield plugin.run_records(loaded, cfg, specs[hid], hid, tasks,
                                         [r for r in records if r["harness_id"] == hid], samples, seed, tag,
                                         loop_states[hid])  # type: ignore[index]
                continue
            n_eps, reward = 0, 0.0
            while pending and pending[0].shard.harness_id == hid:
                inp = pending.pop(0)
                res = next(results)
                eps = _checked_shard(inp, res, samples, seed, tag)
                n_eps += len(eps)
                reward += sum(e["reward"] for e in eps)
                yield eps, res["turns"]
            log.info("%s: %s: %d episodes, mean reward %.3f", tag, specs[hid].name, n_eps, reward / max(n_eps, 1))
    finally:
        results.close()
        if isinstance(policy, PolicySource) and (plugin_ids or rc.task_runner in ("serial", "thread")):
            release_policy(policy)


def _checked_shard(inp: Any, res: dict[str, Any], samples: int, seed: int, tag: str) -> list[dict[str, Any]]:
    """A shard's episodes with ``record``, ``sample_idx``, ``seed`` and ``policy_id`` added, after
    checking they came back in job order (ValueError otherwise)."""
    from tasks.rollout.fanout import episode_jobs

    jobs = episode_jobs(inp.records, inp.tasks, samples, seed, tag, res["policy_id"])
    got = [e["episode_id"] for e in res["episodes"]]
    if got != [j.episode_id for j in jobs]:
        raise ValueError(f"{inp.shard.label}: the engine returned episodes {got[:3]}... out of job order")
    for e, j in zip(res["episodes"], jobs):
        e.update(record=j.record, sample_idx=j.sample_idx, seed=j.seed, policy_id=res["policy_id"])
    return res["episodes"]


def episode_rows(eps: list[dict[str, Any]], policy_id: str, policy_version: int) -> list[dict[str, Any]]:
    """Rows of the ``episodes`` artifact from :func:`run_records` output (its ``record`` entries
    are consumed). ``group_id`` is the sampling group, (task, harness)."""
    gids = group_ids([e["record"]["task_id"] for e in eps], [e["record"]["harness_id"] for e in eps], "within")
    rows = []
    for e, g in zip(eps, gids):
        r = e.pop("record")
        rows.append({
            "episode_id": e["episode_id"], "record_id": r["record_id"], "task_id": r["task_id"],
            "task_hash": r["task_hash"], "harness_id": r["harness_id"], "harness_name": r["harness_name"],
            "split": r["split"], "policy_id": policy_id, "policy_version": policy_version, "group_id": g,
            "sample_idx": e["sample_idx"], "seed": e["seed"], "reward": e["reward"], "success": e["success"],
            "status": e["status"], "stop_reason": e["stop_reason"], "num_turns": e["num_turns"], "input_tokens": e["input_tokens"],
            "output_tokens": e["output_tokens"], "final_answer": e["final_answer"],
            "answer_parsed": bool(e["answer_parsed"]),
        })
    return rows
