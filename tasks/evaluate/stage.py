"""The evaluate stage: sealed evaluation of the test split.

Order of operations (the point of sealing):
1. leakage guard: no test-split task hash may appear in the training rollouts;
2. the plan (test records, checkpoints + adapter SHA-256s, harnesses, attempts, seeds) is written
   and its hash committed (``evaluate/plan.json``, ``evaluate/plan.sha256``) before any attempt;
3. every attempt runs; rows are chained to the plan hash in plan order and written.
``harnessrl verify RUN_DIR`` recomputes everything (:func:`verify_run`).
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.seal import SealError, VerifyReport, plan_hash, seal_rows, verify_chain
from tasks.hashing import seed_from, sha256_dir
from tasks.rollout.fanout import PolicySource
from tasks.rollout.stage import harness_specs, run_records
from tasks.train.stage import LeakageError

log = logging.getLogger("harnessrl.evaluate")

PLAN = "evaluate/plan.json"
PLAN_HASH = "evaluate/plan.sha256"


def build_plan(cfg: RunConfig, tasks: list[dict[str, Any]], records: list[dict[str, Any]],
               checkpoints: list[dict[str, Any]], inputs: dict[str, ArtifactRef]) -> dict[str, Any]:
    """The evaluation plan: every (test record, checkpoint, attempt) that will run, and how."""
    eval_names = cfg.eval_harnesses()
    recs = sorted((r for r in records if r["split"] == "test" and r["harness_name"] in eval_names),
                  key=lambda r: (r["harness_name"], r["record_id"]))
    if not recs:
        raise ValueError("evaluate: no test-split records under the evaluation harnesses")
    return {
        "version": 1,
        "records": [{"record_id": r["record_id"], "task_hash": r["task_hash"], "harness_name": r["harness_name"],
                     "harness_id": r["harness_id"]} for r in recs],
        "checkpoints": [{"name": c["name"], "path": c["path"], "adapter_sha256": c["adapter_sha256"],
                         "base_model_id": c["base_model_id"]} for c in checkpoints],
        "harnesses": sorted(eval_names),
        "attempts": cfg.evaluate.attempts,
        "seed": cfg.evaluate.seed,
        "policy": cfg.policy.model_dump(mode="json"),
        "sandbox": cfg.sandbox.model_dump(mode="json"),
        "inputs": {k: v.sha256 for k, v in sorted(inputs.items())},
    }


def run_evaluate(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Plan, seal, run and write the ``evaluations`` artifact."""
    tasks = store.rows(inputs["tasks"])
    test_hashes = {t["task_hash"]: t["task_id"] for t in tasks if t["split"] == "test"}
    leaked = sorted({test_hashes[e["task_hash"]] for e in store.rows(inputs["episodes"]) if e["task_hash"] in test_hashes})
    if leaked:
        raise LeakageError(f"evaluate: {len(leaked)} test-split task(s) appear in the training rollouts: {leaked[:10]}")
    records = store.rows(inputs["records"])
    checkpoints = store.rows(inputs["checkpoints"])
    plan = build_plan(cfg, tasks, records, checkpoints, inputs)
    ph = plan_hash(plan)
    store.write_json(PLAN, plan)
    store.write_text(PLAN_HASH, ph + "\n")
    log.info("evaluation plan %s committed: %d records x %d checkpoints x %d attempts", ph[:16],
             len(plan["records"]), len(plan["checkpoints"]), plan["attempts"])

    task_by_id = {t["task_id"]: t for t in tasks}
    rec_by_id = {r["record_id"]: r for r in records}
    specs = harness_specs(store, inputs["harnesses"])
    plan_recs = [rec_by_id[p["record_id"]] for p in plan["records"]]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="harnessrl-eval-") as tmp:
        for ck in plan["checkpoints"]:
            adapter = None
            if ck["path"]:
                adapter = store.get_dir(ck["path"], Path(tmp) / ck["name"])
                if sha256_dir(adapter) != ck["adapter_sha256"]:
                    raise ValueError(f"checkpoint {ck['name']}: files changed since training")
            policy = PolicySource.of(cfg, adapter)  # loaded once per process by whichever runner runs it
            eps, _ = run_records(policy, cfg, specs, task_by_id, plan_recs, plan["attempts"],
                                 seed_from(plan["seed"], ck["name"]), f"eval:{ck['name']}")
            for e in eps:
                r = e.pop("record")
                status = e["status"] if e["status"] != "ok" else ("resolved" if e["success"] else "unresolved")
                rows.append({
                    "eval_id": e["episode_id"], "record_id": r["record_id"], "task_id": r["task_id"],
                    "task_hash": r["task_hash"], "checkpoint": ck["name"], "adapter_sha256": ck["adapter_sha256"],
                    "harness_id": r["harness_id"], "harness_name": r["harness_name"], "attempt": e["sample_idx"],
                    "seed": e["seed"], "reward": e["reward"], "resolved": status == "resolved", "status": status,
                    "num_turns": e["num_turns"], "output_tokens": e["output_tokens"],
                })
    order = {(p["record_id"]): i for i, p in enumerate(plan["records"])}
    ck_order = {c["name"]: i for i, c in enumerate(plan["checkpoints"])}
    rows.sort(key=lambda r: (ck_order[r["checkpoint"]], order[r["record_id"]], r["attempt"]))
    sealed = seal_rows(rows, ph)
    ref = store.write("evaluate", "evaluations", sealed, inputs=list(inputs.values()),
                      config_hash=cfg.section_hash("policy", "sandbox", "evaluate", "rollout"), extra={"plan_hash": ph})
    return {"evaluations": ref}


def verify_run(store: ArtifactStore) -> VerifyReport:
    """Recompute the sealed evaluation of a run from its files.

    Raises:
        SealError: the plan, a checkpoint's files or a row changed (the message says which).
        ArtifactError: the evaluations file is missing or fails its contract or manifest hash.
    """
    plan = store.read_json(PLAN)
    committed = store.read_bytes(PLAN_HASH).decode().strip()
    # the rows without the manifest-hash check: verify must name the broken row, not just the file
    rows = store.raw_rows("evaluate", "evaluations")

    def ck_sha(ck: dict[str, Any]) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            return sha256_dir(store.get_dir(ck["path"], Path(tmp) / "ck"))

    report = verify_chain(plan, committed, rows, checkpoint_sha=ck_sha)
    manifest = store.manifest("evaluate", "evaluations")
    file_sha = hashlib.sha256(store.read_bytes("evaluate/evaluations.parquet")).hexdigest()
    if file_sha != manifest["sha256"]:
        raise SealError(f"evaluate/evaluations.parquet: SHA-256 {file_sha[:16]}... differs from its manifest")
    return report
