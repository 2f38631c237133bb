"""Analysis tables that load a trained checkpoint: P1's log-odds check (its adapter against the
base model with the adapter disabled, at first-turn states of the training rollouts) and the
per-step branching mismatch (continuations branched from the sealed episodes' visited states)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.registries.applications import enters_engine_tables


def _trained(checkpoints: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    return [c for c in checkpoints if c["name"] != reference and c["path"]]


def _scorers(cfg: RunConfig, adapter: Path, batch_size: int) -> tuple[Any, Any]:
    """The log-odds scorers of a checkpoint: the base model in float32 (bf16 logits would add
    ~0.4% error per token to the sums) with the adapter on (policy) and off (reference)."""
    from peft import PeftModel

    from tasks.analysis.logodds import adapter_scorers
    from tasks.rollout.models import load_model_and_tokenizer, resolve_model

    model, tok = load_model_and_tokenizer(resolve_model(cfg.policy.model, cfg.policy.cache_dir), cfg.policy.device,
                                          "float32")
    model = PeftModel.from_pretrained(model, adapter).eval()
    return adapter_scorers(model, tok, device=cfg.policy.device, batch_size=batch_size)


def log_odds_tables(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], specs: dict[str, Any],
                    tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(log_odds, log_odds_pairs)`` rows for every trained checkpoint (its adapter against the
    base model with the adapter disabled), at first-turn states of the training rollouts."""
    lo = cfg.analyze.log_odds
    cks = _trained(store.rows(inputs["checkpoints"]), cfg.analyze.reference)
    if not cks or lo.max_states_per_harness == 0:
        return [], []
    from tasks.analysis.logodds import log_odds_pairs, log_odds_summary

    episodes, turns = store.rows(inputs["episodes"]), store.rows(inputs["turns"])
    # an application's episodes outside the engine tables (a mesh's turns are separate messages, no
    # first-turn state shared by one growing context): left out, with its note from run_analyze
    episodes = [e for e in episodes if enters_engine_tables(specs[e["harness_id"]].loop_type)]
    if not episodes:
        return [], []
    summary, pairs = [], []
    for ck in cks:
        adapter = store.get_dir(ck["path"], tmp / "logodds" / ck["name"])
        score_policy, score_ref = _scorers(cfg, adapter, lo.batch_size)
        rows = log_odds_pairs(episodes, turns, specs, score_policy, score_ref,
                              max_states_per_harness=lo.max_states_per_harness, seed=cfg.analyze.seed)
        for r in rows:
            r["checkpoint"] = ck["name"]
        pairs += rows
        for s in log_odds_summary(rows):
            summary.append({"checkpoint": ck["name"], **s})
    return summary, pairs


def branching_rows(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], specs: dict[str, Any],
                   evals: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """``step_mismatch`` rows: continuations branched from the visited states of
    ``analyze.branching.episodes_per_harness`` first-attempt sealed episodes per (checkpoint,
    harness) of the configured checkpoints (chosen with the analyze seed)."""
    br = cfg.analyze.branching
    if br.episodes_per_harness == 0:
        return []
    from tasks.analysis.branching import branch_states
    from tasks.hashing import seed_from
    from tasks.rollout.engines import load_policy

    cks = {c["name"]: c for c in store.rows(inputs["checkpoints"])}
    missing = [c for c in br.checkpoints if c not in cks]
    if missing:
        raise ValueError(f"analyze.branching.checkpoints names {missing}, not checkpoints of this run {sorted(cks)}")
    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    turns = store.rows(inputs["eval_turns"], contract="turns")
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    out: list[dict[str, Any]] = []
    for name in br.checkpoints:
        ck = cks[name]
        chosen = []
        for hid in sorted({e["harness_id"] for e in evals if e["checkpoint"] == name
                           and enters_engine_tables(specs[e["harness_id"]].loop_type)}):  # no engine replay
            cand = sorted((e for e in evals if e["checkpoint"] == name and e["harness_id"] == hid and e["retry"] == 0
                           and e["attempt"] == 0 and e["status"] in ("resolved", "unresolved")
                           and e["eval_id"] in by_ep),
                          key=lambda e: seed_from(cfg.analyze.seed, "branching", e["eval_id"]))
            chosen += cand[:br.episodes_per_harness]
        if not chosen:
            continue
        adapter = store.get_dir(ck["path"], tmp / "branching" / name) if ck["path"] else None
        policy = load_policy(cfg, adapter)
        try:
            for hid in sorted({e["harness_id"] for e in chosen}):
                eps = [{"episode_id": e["eval_id"], "record_id": e["record_id"], "task_id": e["task_id"],
                        "harness_id": hid, "harness_name": e["harness_name"], "num_turns": e["num_turns"],
                        "success": e["resolved"], "reward": e["reward"], "status": "ok", "seed": e["seed"],
                        "sample_idx": e["attempt"]}
                       for e in chosen if e["harness_id"] == hid]
                rows = branch_states(policy, specs[hid], eps, [t for e in eps for t in by_ep[e["episode_id"]]],
                                     tasks, cfg.sandbox, n=br.n, k=br.k, seed=seed_from(cfg.analyze.seed, name, hid),
                                     max_depth=br.max_depth)
                out += [{"checkpoint": name, "k": br.k, **r} for r in rows]
        finally:
            close = getattr(policy, "close", None)
            if close is not None:
                close()
    return out
