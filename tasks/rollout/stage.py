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
    """Run ``samples`` episodes per record under its harness. Episode ids are content hashes of
    (record, tag, policy, sample index, seed); rows come back in (harness, record, sample) order."""
    from tasks.rollout.harness import EpisodeJob, run_episodes

    episodes, turns = [], []
    for hid in sorted({r["harness_id"] for r in records}, key=lambda h: specs[h].name):
        spec = specs[hid]
        recs = sorted((r for r in records if r["harness_id"] == hid), key=lambda r: r["record_id"])
        jobs = []
        for r in recs:
            for i in range(samples):
                eid = sha256_json([r["record_id"], tag, policy.policy_id, i, seed])[:32]
                jobs.append(EpisodeJob(eid, r, tasks[r["task_id"]], i, seed_from(seed, r["record_id"], i)))
        eps, trn = run_episodes(policy, spec, jobs, cfg.sandbox, seed=seed_from(seed, tag, hid))
        by_id = {j.episode_id: j for j in jobs}
        for e in eps:
            j = by_id[e["episode_id"]]
            e.update(record=j.record, sample_idx=j.sample_idx, seed=j.seed)
        log.info("%s: %s: %d episodes, mean reward %.3f", tag, spec.name, len(eps),
                 sum(e["reward"] for e in eps) / max(len(eps), 1))
        episodes += eps
        turns += trn
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
    policy = load_policy(cfg)
    eps, turns = run_records(policy, cfg, specs, tasks, records, cfg.rollout.samples_per_task,
                             seed_from(cfg.seed, "rollout"), "rollout")
    rows = episode_rows(eps, policy.policy_id, 0)
    ch = cfg.section_hash("policy", "sandbox", "rollout")
    ins = [inputs["tasks"], inputs["harnesses"], inputs["records"]]
    ep_ref = store.write("rollout", "episodes", rows, inputs=ins, config_hash=ch)
    tu_ref = store.write("rollout", "turns", turns, inputs=ins, config_hash=ch)
    return {"episodes": ep_ref, "turns": tu_ref}
