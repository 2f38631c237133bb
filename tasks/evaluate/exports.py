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
- ``evaluate/inspect/<checkpoint>.<harness>.eval``: one Inspect AI eval log per
  (checkpoint, evaluation harness), written with inspect-ai's own types
  (:mod:`tasks.evaluate.inspect_log`); ``inspect view`` and ``inspect_ai.log.read_eval_log`` open
  them. :func:`check_inspect_logs` checks them against the sealed rows (``harnessrl verify``).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import ArtifactStore
from tasks.evaluate.stats import final_attempts

if TYPE_CHECKING:
    from tasks.evaluate.inspect_log import TurnSource

EXPORT_DIR = "evaluate/exports/swebench"


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


def write_exports(store: ArtifactStore, run_name: str, plan: dict[str, Any], p_hash: str, rows: list[dict[str, Any]],
                  cells: list[dict[str, Any]], turns: "TurnSource", tasks: dict[str, dict[str, Any]],
                  systems: dict[str, str], turn_times: dict[str, list[list[float]]] | None = None,
                  tool_calls: dict[str, list[list[dict[str, Any]]]] | None = None) -> list[str]:
    """Write the SWE-bench-style files and the Inspect logs atomically; returns the written paths.
    ``turns``: the attempts' turn rows, or a function from eval_ids to their turn rows (one Inspect
    log's worth at a time); ``tasks``: task_id -> task row; ``systems``: harness name -> its rendered
    system prompt; ``turn_times``: eval_id -> each turn's engine-call timing; ``tool_calls``:
    eval_id -> each turn's tool-call records (both: see
    :func:`tasks.evaluate.inspect_log.write_inspect_logs`)."""
    from tasks.evaluate.inspect_log import write_inspect_logs

    files = swebench_files(run_name, plan, rows)
    for rel, data in files.items():
        store.write_bytes(rel, data)
    logs = write_inspect_logs(store, run_name, plan, p_hash, rows, cells, turns, tasks, systems, turn_times=turn_times,
                              tool_calls=tool_calls)
    return [*files, *logs]


def check_inspect_logs(run_dir: str, *, strict: bool = False) -> list[str]:
    """Problems found when the run's Inspect logs are read back with
    :func:`inspect_ai.log.read_eval_log` and compared with the sealed rows (empty: consistent).

    Per (checkpoint, harness) of ``evaluate/plan.json``: the log exists and reads as an Inspect
    log; its ``eval.metadata`` names the committed plan hash, the chain head (the last sealed row's
    ``seal_hash``), the checkpoint and the harness; its samples are exactly the planned attempts'
    final outcomes (``id`` = task_id, ``epoch`` = attempt + 1), each with the row's ``eval_id``,
    ``seq`` and ``seal_hash``, the score ``resolved`` "C" iff the row resolved, ``reward`` equal to
    the row's, and no score but an error for an ``infra_error``. No other ``.eval`` file is in
    ``evaluate/inspect``.

    Args:
        run_dir: a run folder or fsspec URL.
        strict: raise :class:`tasks.evaluate.seal.SealError` listing the problems instead of
            returning them.

    Returns:
        One line per problem, naming the log and the sample.
    """
    from inspect_ai.log import read_eval_log

    from tasks.evaluate.inspect_log import INSPECT_DIR, log_path
    from tasks.evaluate.seal import SealError

    store = ArtifactStore(run_dir)
    plan = store.read_json("evaluate/plan.json")
    committed = store.read_bytes("evaluate/plan.sha256").decode().strip()
    rows = store.raw_rows("evaluate", "evaluations")
    head = rows[-1]["seal_hash"] if rows else committed
    finals = final_attempts(rows)
    problems: list[str] = []
    present = {p for p in store.list_files(INSPECT_DIR) if p.endswith(".eval")} if store.exists(INSPECT_DIR) else set()
    expected = set()
    with tempfile.TemporaryDirectory(prefix="harnessrl-inspect-check-") as tmp:
        for ck in plan["checkpoints"]:
            for h in plan["harnesses"]:
                want = {(r["task_id"], r["attempt"] + 1): r for k, r in finals.items() if k[0] == ck["name"] and k[1] == h}
                rel = log_path(ck["name"], h)
                expected.add(rel)
                if rel not in present:
                    problems.append(f"{rel}: missing (checkpoint {ck['name']}, harness {h})")
                    continue
                local = Path(tmp) / Path(rel).name
                local.write_bytes(store.read_bytes(rel))
                try:
                    log = read_eval_log(str(local))
                except Exception as e:  # noqa: BLE001 - any failure to read is the finding
                    problems.append(f"{rel}: read_eval_log failed: {type(e).__name__}: {str(e)[:200]}")
                    continue
                problems += _check_log(rel, log, committed, head, ck["name"], h, want)
    problems += [f"{p}: not a (checkpoint, harness) of the plan" for p in sorted(present - expected)]
    if strict and problems:
        raise SealError(f"Inspect logs: {len(problems)} problem(s): " + "; ".join(problems[:5]))
    return problems


def _check_log(rel: str, log: Any, plan_hash: str, head: str, ck: str, h: str,
               want: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    out = []
    meta = log.eval.metadata or {}
    for key, value in (("plan_hash", plan_hash), ("chain_head", head), ("checkpoint", ck), ("harness_name", h)):
        if meta.get(key) != value:
            out.append(f"{rel}: eval.metadata.{key} = {str(meta.get(key))[:20]!r}, sealed {str(value)[:20]!r}")
    got = {(str(s.id), int(s.epoch)): s for s in (log.samples or [])}
    for key in sorted(set(want) - set(got)):
        out.append(f"{rel}: no sample for task {key[0]} epoch {key[1]}")
    for key in sorted(set(got) - set(want)):
        out.append(f"{rel}: sample task {key[0]} epoch {key[1]} is not a sealed attempt")
    for key in sorted(set(want) & set(got)):
        r, s = want[key], got[key]
        where = f"{rel}: sample {key[0]} epoch {key[1]}"
        for col in ("eval_id", "seq", "seal_hash"):
            if s.metadata.get(col) != r[col]:
                out.append(f"{where}: metadata.{col} = {str(s.metadata.get(col))[:20]!r}, sealed {str(r[col])[:20]!r}")
        if r["status"] == "infra_error":
            if s.scores or s.error is None:
                out.append(f"{where}: a sealed infra_error must have no score and an error")
            continue
        scores = s.scores or {}
        res = scores.get("resolved")
        if res is None or res.value != ("C" if r["resolved"] else "I"):
            out.append(f"{where}: resolved = {None if res is None else res.value!r}, sealed "
                       f"{'C' if r['resolved'] else 'I'!r} ({r['status']})")
        rew = scores.get("reward")
        if rew is None or float(rew.value) != float(r["reward"]):
            out.append(f"{where}: reward = {None if rew is None else rew.value!r}, sealed {r['reward']!r}")
    return out
