"""The rollout stage: train-split records x the base policy -> ``episodes``, ``turns``."""

from __future__ import annotations

from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.harnesses.frozen import harness_specs
from tasks.hashing import seed_from
from tasks.rollout.runner import episode_rows, run_records


def run_rollout(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Sample ``rollout.samples_per_task`` episodes per train record with the base policy.

    With harnesses of a plugged-in loop type among the records (:mod:`tasks.rollout.loop_plugins`,
    e.g. ``talkmesh``), first fit each plugin's state on the train records with the base policy and
    write it as the plugin's ``state_artifact`` (``talkmesh_head``: one row per harness) with the
    artifacts it returns beside it (``talkmesh_calibration_<harness name>``); its episodes run with
    the state as read back from that file."""
    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    specs = harness_specs(store, inputs["harnesses"])
    records = [r for r in store.rows(inputs["records"]) if r["split"] == "train"]
    if not records:
        raise ValueError("rollout: the frozen records have no train split")
    from tasks.rollout.fanout import PolicySource, cached_policy, release_policy
    from tasks.rollout.loop_plugins import plugin_of

    source = PolicySource.of(cfg)
    ch = cfg.section_hash("policy", "sandbox", "rollout")
    ins = [inputs["tasks"], inputs["harnesses"], inputs["records"]]
    out: dict[str, ArtifactRef] = {}
    states: dict[str, Any] = {}
    loops = {p.loop_type: p for p in (plugin_of(specs[r["harness_id"]]) for r in records) if p is not None}
    for plugin in (loops[k] for k in sorted(loops)):  # each loop type's state first (base policy, train tasks)
        try:
            state_rows, extra = plugin.fit(cached_policy(source), cfg, specs, tasks, records)
        except BaseException:
            release_policy(source)  # an engine's worker process must not outlive a failed fit
            raise
        if plugin.state_artifact is None:
            continue
        ref = out[plugin.state_artifact] = store.write("rollout", plugin.state_artifact, state_rows, inputs=ins,
                                                       config_hash=ch)
        for name, (rows, contract) in extra.items():
            out[name] = store.write("rollout", name, rows, contract=contract, inputs=[ref], config_hash=ch)
        states.update(plugin.states(store.rows(ref)))
    eps, turns = run_records(source, cfg, specs, tasks, records, cfg.rollout.samples_per_task,
                             seed_from(cfg.seed, "rollout"), "rollout", loop_states=states or None)
    # no episode at all: the episodes artifact refuses to be empty (schemas.contracts), in one line
    rows = episode_rows(eps, eps[0]["policy_id"], 0) if eps else []
    ep_ref = store.write("rollout", "episodes", rows, inputs=ins, config_hash=ch)
    tu_ref = store.write("rollout", "turns", turns, inputs=ins, config_hash=ch)
    return {"episodes": ep_ref, "turns": tu_ref, **out}
