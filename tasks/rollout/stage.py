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
                records: list[dict[str, Any]], samples: int, seed: int, tag: str, *,
                mesh_heads: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``samples`` episodes per record under its harness, fanned out over ``cfg.rollout``'s task
    runner (see :mod:`tasks.rollout.fanout`). Records of ``talkmesh`` harnesses are run in this
    process by :func:`tasks.talkmesh.episodes.run_mesh_records` (one mesh run per episode), with
    their fitted confidence head from ``mesh_heads`` (harness_id -> ConfidenceHead).

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
            another order than its jobs (an engine contract violation); a talkmesh harness with
            no head in ``mesh_heads``.
    """
    from tasks.rollout.fanout import PolicySource, cached_policy, pin_torch_threads, release_policy, torch_threads
    from tasks.talkmesh.episodes import hidden_states, is_mesh, run_mesh_records

    mesh_ids = {r["harness_id"] for r in records if r["harness_id"] in specs and is_mesh(specs[r["harness_id"]])}
    if not mesh_ids:
        return _run_engine_records(policy, cfg, specs, tasks, records, samples, seed, tag)
    missing = sorted(specs[h].name for h in mesh_ids if h not in (mesh_heads or {}))
    if missing:
        raise ValueError(f"{tag}: talkmesh harness(es) {missing} have no fitted confidence head (the rollout stage's "
                         "talkmesh_head artifact)")
    by_hid: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    plain = [r for r in records if r["harness_id"] not in mesh_ids]
    if plain:
        eps, turns = _run_engine_records(policy, cfg, specs, tasks, plain, samples, seed, tag)
        for hid in dict.fromkeys(e["record"]["harness_id"] for e in eps):
            ids = {e["episode_id"] for e in eps if e["record"]["harness_id"] == hid}
            by_hid[hid] = ([e for e in eps if e["episode_id"] in ids], [t for t in turns if t["episode_id"] in ids])
    pin_torch_threads(torch_threads(cfg))  # as run_shard does: the thread count changes CPU reduction order
    loaded = cached_policy(policy) if isinstance(policy, PolicySource) else policy
    try:
        for hid in sorted(mesh_ids, key=lambda h: (specs[h].name, h)):
            by_hid[hid] = run_mesh_records(loaded, cfg, specs[hid], hid, tasks,
                                           [r for r in records if r["harness_id"] == hid], samples, seed, tag,
                                           mesh_heads[hid], hidden_states(cfg, specs[hid]))  # type: ignore[index]
    finally:
        if isinstance(policy, PolicySource):
            release_policy(policy)
    episodes, turns = [], []
    for hid in sorted(by_hid, key=lambda h: (specs[h].name, h)):
        episodes += by_hid[hid][0]
        turns += by_hid[hid][1]
    return episodes, turns


def _run_engine_records(policy: Any, cfg: RunConfig, specs: dict[str, HarnessSpec], tasks: dict[str, dict[str, Any]],
                        records: list[dict[str, Any]], samples: int, seed: int, tag: str
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:func:`run_records` for harnesses the engine runs (every loop type but talkmesh)."""
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
            "status": e["status"], "stop_reason": e["stop_reason"], "num_turns": e["num_turns"], "input_tokens": e["input_tokens"],
            "output_tokens": e["output_tokens"], "final_answer": e["final_answer"],
        })
    return rows


def run_rollout(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Sample ``rollout.samples_per_task`` episodes per train record with the base policy.

    With a ``talkmesh`` harness among the records, first fit its confidence head
    (:func:`tasks.talkmesh.episodes.fit_heads`) and write ``talkmesh_head`` (one row per talkmesh
    harness) and ``talkmesh_calibration_<harness name>`` (contract ``talkmesh_calibration``); the
    mesh episodes are scored with the head as read back from that file."""
    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    specs = harness_specs(store, inputs["harnesses"])
    records = [r for r in store.rows(inputs["records"]) if r["split"] == "train"]
    if not records:
        raise ValueError("rollout: the frozen records have no train split")
    from tasks.rollout.fanout import PolicySource, cached_policy, release_policy
    from tasks.talkmesh.episodes import fit_heads, heads_from_rows, is_mesh

    source = PolicySource.of(cfg)
    ch = cfg.section_hash("policy", "sandbox", "rollout")
    ins = [inputs["tasks"], inputs["harnesses"], inputs["records"]]
    out: dict[str, ArtifactRef] = {}
    heads = None
    if any(is_mesh(specs[r["harness_id"]]) for r in records):
        # talkmesh harnesses: the confidence head first (base-policy proposals on the train tasks)
        from tasks.talkmesh import contracts as _contracts  # noqa: F401  (registers the contracts)

        try:
            head_rows, calib = fit_heads(cached_policy(source), cfg, specs, tasks, records)
        except BaseException:
            release_policy(source)  # an engine's worker process must not outlive a failed fit
            raise
        out["talkmesh_head"] = store.write("rollout", "talkmesh_head", head_rows, inputs=ins, config_hash=ch)
        for name, rows in calib.items():
            out[f"talkmesh_calibration_{name}"] = store.write(
                "rollout", f"talkmesh_calibration_{name}", rows, contract="talkmesh_calibration",
                inputs=[out["talkmesh_head"]], config_hash=ch)
        heads = heads_from_rows(store.rows(out["talkmesh_head"]))
    eps, turns = run_records(source, cfg, specs, tasks, records, cfg.rollout.samples_per_task,
                             seed_from(cfg.seed, "rollout"), "rollout", mesh_heads=heads)
    rows = episode_rows(eps, eps[0]["policy_id"], 0)
    ep_ref = store.write("rollout", "episodes", rows, inputs=ins, config_hash=ch)
    tu_ref = store.write("rollout", "turns", turns, inputs=ins, config_hash=ch)
    return {"episodes": ep_ref, "turns": tu_ref, **out}
