"""The rollout stage: train-split records x the base policy -> ``episodes``, ``turns``."""

from __future__ import annotations

import json
import logging
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.harnesses.spec import HarnessSpec
from tasks.hashing import seed_from, sha256_json
from tasks.train.advantages import group_ids

log = logging.getLogger("harnessrl.rollout")


def harness_specs(store: ArtifactStore, ref: ArtifactRef) -> dict[str, HarnessSpec]:
    """Frozen harness specs by harness_id, rebuilt from the ``harnesses`` artifact (not from the
    YAML files, which may have changed since freeze). Raises ValueError if a spec's hash differs."""
    out = {}
    for row in store.rows(ref):
        spec = HarnessSpec.model_validate(json.loads(row["spec_json"]))
        if spec.harness_id != row["harness_id"]:
            raise ValueError(f"harness {row['name']!r}: frozen spec hashes to {spec.harness_id[:12]}, not {row['harness_id'][:12]}")
        out[row["harness_id"]] = spec
    return out


def load_policy(cfg: RunConfig, adapter_dir: Any = None) -> Any:
    """The rollout policy of ``policy.engine`` (hf | vllm | openai) on ``policy.model`` with an
    optional LoRA adapter folder (see :func:`tasks.rollout.engines.make_policy`)."""
    from tasks.rollout.engines import make_policy
    from tasks.rollout.models import model_id, resolve_model

    path = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    return make_policy(path, cfg.policy, base_model_id=model_id(path), adapter_dir=adapter_dir)


def run_records(policy: Any, cfg: RunConfig, specs: dict[str, HarnessSpec], tasks: dict[str, dict[str, Any]],
                records: list[dict[str, Any]], samples: int, seed: int, tag: str
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``samples`` episodes per record under its harness, fanned out over ``cfg.rollout``'s task
    runner (see :mod:`tasks.rollout.fanout`).

    Args:
        policy: a :class:`tasks.rollout.fanout.PolicySource` (any runner; each process loads it
            once) or a loaded policy object (runners ``serial`` and ``thread`` only).
        samples: episodes per record; ``seed``: the call's seed; ``tag``: names the call
            (``rollout``, ``eval:<checkpoint>``, ...) in episode ids and seeds.

    Returns:
        ``(episodes, turns)``: episode dicts as ``run_episodes`` makes them plus ``record``,
        ``sample_idx``, ``seed`` and ``policy_id``, in (harness name, record id, sample) order;
        turn rows in the same episode order. Episode ids are content hashes of (record, tag,
        policy, sample index, seed). The rows do not depend on ``task_runner`` or ``workers``.

    Raises:
        tasks.rollout.fanout.ShardError: a shard failed (the message names it).
        ValueError: a policy object with the ``dask`` runner; or a shard's episodes came back in
            another order than its jobs (an engine contract violation).
    """
    from tasks.rollout.fanout import (PolicySource, ShardInput, episode_jobs, fan_out, plan_shards, release_policy,
                                      torch_threads)

    rc = cfg.rollout
    threads = torch_threads(cfg)
    by_id = {r["record_id"]: r for r in records}
    shards = plan_shards(records, specs, samples, rc.shard_size)
    inputs = []
    for sh in shards:
        recs = [by_id[i] for i in sh.record_ids]
        inputs.append(ShardInput(sh, specs[sh.harness_id], recs, {r["task_id"]: tasks[r["task_id"]] for r in recs},
                                 seed, tag, cfg.sandbox, threads))
    try:
        results = fan_out(inputs, policy, rc)
    finally:
        if isinstance(policy, PolicySource) and rc.task_runner in ("serial", "thread"):
            release_policy(policy)
    episodes, turns = [], []
    for inp, res in zip(inputs, results):
        jobs = episode_jobs(inp.records, inp.tasks, samples, seed, tag, res["policy_id"])
        got = [e["episode_id"] for e in res["episodes"]]
        if got != [j.episode_id for j in jobs]:
            raise ValueError(f"{inp.shard.label}: the engine returned episodes {got[:3]}... out of job order")
        for e, j in zip(res["episodes"], jobs):
            e.update(record=j.record, sample_idx=j.sample_idx, seed=j.seed, policy_id=res["policy_id"])
        episodes += res["episodes"]
        turns += res["turns"]
    for hid in dict.fromkeys(sh.harness_id for sh in shards):
        eps = [e for e in episodes if e["record"]["harness_id"] == hid]
        log.info("%s: %s: %d episodes, mean reward %.3f", tag, specs[hid].name, len(eps),
                 sum(e["reward"] for e in eps) / max(len(eps), 1))
    return episodes, turns


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
            "status": e["status"], "num_turns": e["num_turns"], "input_tokens": e["input_tokens"],
            "output_tokens": e["output_tokens"], "final_answer": e["final_answer"],
        })
    return rows


def run_rollout(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Sample ``rollout.samples_per_task`` episodes per train record with the base policy."""
    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    specs = harness_specs(store, inputs["harnesses"])
    records = [r for r in store.rows(inputs["records"]) if r["split"] == "train"]
    if not records:
        raise ValueError("rollout: the frozen records have no train split")
    from tasks.rollout.fanout import PolicySource

    eps, turns = run_records(PolicySource.of(cfg), cfg, specs, tasks, records, cfg.rollout.samples_per_task,
                             seed_from(cfg.seed, "rollout"), "rollout")
    rows = episode_rows(eps, eps[0]["policy_id"], 0)
    ch = cfg.section_hash("policy", "sandbox", "rollout")
    ins = [inputs["tasks"], inputs["harnesses"], inputs["records"]]
    ep_ref = store.write("rollout", "episodes", rows, inputs=ins, config_hash=ch)
    tu_ref = store.write("rollout", "turns", turns, inputs=ins, config_hash=ch)
    return {"episodes": ep_ref, "turns": tu_ref}
