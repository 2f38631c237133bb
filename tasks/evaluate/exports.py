"""Exports of a sealed evaluation that other tools read without harnessrl's code.

Written by the evaluate stage into the run folder, each file atomically through
:meth:`schemas.ArtifactStore.write_bytes`:

- ``evaluate/exports/swebench/<model>.predictions.jsonl``: one SWE-bench-style predictions file per
  model, where a "model" is one (checkpoint, harness, attempt) and is named
  ``<run>.<checkpoint>.<harness>.attempt<a>`` (SWE-bench keys predictions by ``instance_id``, so
  one file may hold one prediction per instance). Lines: ``{"instance_id": task_id,
  "model_name_or_path": model, "model_patch": final answer}``. ``model_patch`` is the agent's
  final answer text (for answer tasks the answer; for workspace and browser tasks the agent's
  final message), not a diff: harnessrl grades workspaces in its own sandbox, so this file is for
  reading and comparing, not for re-grading with SWE-bench's docker harness.
- ``evaluate/exports/swebench/<model>.report.json``: SWE-bench's run-report layout
  (``schema_version`` 2): ``resolved_ids``, ``unresolved_ids`` (timeouts included: graded
  failures), ``error_ids`` (infra errors), ``empty_patch_ids``, ``completed_ids``, ``submitted_ids``,
  ``incomplete_ids`` and their counts. An attempt's outcome is its last retry.
- ``evaluate/eval_log.json``: one JSON eval log per run, laid out like Inspect AI's eval log
  (``version``, ``status``, ``eval``, ``plan``, ``results``, ``samples``): the plan and its hash,
  the chain head, package and code versions, the matrix cells and contrasts, and one sample per
  sealed row (``id`` = task_id, ``epoch`` = attempt + 1, scores ``resolved`` "C"/"I" and
  ``reward``). It holds no timestamp, so a re-run gives the same bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from schemas import ArtifactStore
from schemas.store import code_version, package_versions
from tasks.evaluate.stats import final_attempts

EXPORT_DIR = "evaluate/exports/swebench"
EVAL_LOG = "evaluate/eval_log.json"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def swebench_files(run_name: str, plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """The SWE-bench-style predictions and report files, ``{relative path: bytes}``, one pair per
    (checkpoint, harness, attempt) in plan order. Rows need ``task_id``, ``checkpoint``,
    ``harness_name``, ``record_id``, ``attempt``, ``retry``, ``status``, ``final_answer``."""
    finals = final_attempts(rows)
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for (ck, h, _rid, a), r in finals.items():
        groups.setdefault((ck, h, a), []).append(r)
    out: dict[str, bytes] = {}
    for ck in plan["checkpoints"]:
        for h in plan["harnesses"]:
            for a in range(plan["attempts"]):
                rs = sorted(groups.get((ck["name"], h, a), []), key=lambda r: r["task_id"])
                model = _safe(f"{run_name}.{ck['name']}.{h}.attempt{a}")
                preds = "".join(json.dumps({"instance_id": r["task_id"], "model_name_or_path": model,
                                            "model_patch": r["final_answer"]}, ensure_ascii=False) + "\n" for r in rs)
                planned = sorted(p["task_id"] for p in plan["records"] if p["harness_name"] == h)
                ids = {s: sorted(r["task_id"] for r in rs if r["status"] in s) for s in
                       (("resolved",), ("unresolved", "timeout"), ("infra_error",))}
                submitted = sorted(r["task_id"] for r in rs)
                completed = sorted(ids[("resolved",)] + ids[("unresolved", "timeout")])
                report = {
                    "total_instances": len(planned), "submitted_instances": len(submitted),
                    "completed_instances": len(completed), "resolved_instances": len(ids[("resolved",)]),
                    "unresolved_instances": len(ids[("unresolved", "timeout")]),
                    "empty_patch_instances": sum(1 for r in rs if not r["final_answer"]),
                    "error_instances": len(ids[("infra_error",)]),
                    "completed_ids": completed, "incomplete_ids": sorted(set(planned) - set(submitted)),
                    "empty_patch_ids": sorted(r["task_id"] for r in rs if not r["final_answer"]),
                    "submitted_ids": submitted, "resolved_ids": ids[("resolved",)],
                    "unresolved_ids": ids[("unresolved", "timeout")], "error_ids": ids[("infra_error",)],
                    "schema_version": 2,
                }
                out[f"{EXPORT_DIR}/{model}.predictions.jsonl"] = preds.encode("utf-8")
                out[f"{EXPORT_DIR}/{model}.report.json"] = (json.dumps(report, indent=2) + "\n").encode()
    return out


def eval_log(run_name: str, plan: dict[str, Any], p_hash: str, rows: list[dict[str, Any]],
             cells: list[dict[str, Any]], contrasts: list[dict[str, Any]]) -> dict[str, Any]:
    """The Inspect-style eval log of a sealed evaluation as a JSON-ready dict (see module doc)."""
    samples = [{
        "id": r["task_id"], "epoch": r["attempt"] + 1, "checkpoint": r["checkpoint"], "harness": r["harness_name"],
        "retry": r["retry"], "retry_of": r["retry_of"] or None,
        "scores": {"resolved": {"value": "C" if r["resolved"] else "I"}, "reward": {"value": r["reward"]}},
        "output": {"completion": r["final_answer"]},
        "error": {"message": "infrastructure error"} if r["status"] == "infra_error" else None,
        "metadata": {"status": r["status"], "eval_id": r["eval_id"], "record_id": r["record_id"], "seq": r["seq"],
                     "seed": r["seed"], "num_turns": r["num_turns"], "output_tokens": r["output_tokens"],
                     "seal_hash": r["seal_hash"]},
    } for r in rows]
    graded = sum(1 for r in final_attempts(rows).values() if r["status"] != "infra_error")
    return {
        "version": 2,
        "status": "success",
        "eval": {"run_id": p_hash, "task": run_name, "model": plan["policy"]["model"],
                 "dataset": {"samples": len({p["task_id"] for p in plan["records"]})},
                 "config": {"epochs": plan["attempts"], "seed": plan["seed"]},
                 "packages": package_versions(), "revision": code_version()},
        "plan": {"plan": plan, "plan_hash": p_hash, "chain_head": rows[-1]["seal_hash"] if rows else p_hash},
        "results": {"total_samples": len(rows), "completed_samples": graded, "scores": cells, "contrasts": contrasts},
        "samples": samples,
    }


def write_exports(store: ArtifactStore, run_name: str, plan: dict[str, Any], p_hash: str, rows: list[dict[str, Any]],
                  cells: list[dict[str, Any]], contrasts: list[dict[str, Any]]) -> list[str]:
    """Write the SWE-bench-style files and the eval log atomically; returns the written paths."""
    files = swebench_files(run_name, plan, rows)
    for rel, data in files.items():
        store.write_bytes(rel, data)
    log = eval_log(run_name, plan, p_hash, rows, cells, contrasts)
    store.write_bytes(EVAL_LOG, (json.dumps(log, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))
    return [*files, EVAL_LOG]
