"""Agent steps and the failure modes a harness can see, per (checkpoint, harness) (docs/methods/p6-gspo-lora.md).

P6 reports that training cut the median agent steps by 24-35%. :func:`step_failures` reads the
sealed evaluation (its final attempts and their turns, ``eval_turns``) and gives, per cell, the
median and mean turns of the solved and of the failed attempts, how the failed attempts ended
(the harness's stop reasons, rebuilt from the turns by the rule of
``tasks.rollout.harness._Episode.stop_reason``), and counts of the turn-level errors: replies the
harness answered with its format-error message, tool calls whose program failed, and replies cut
at the token limit. A reported table, not a sealed statistic (docs/experiments/p6-gspo.md).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from tasks.evaluate.stats import GRADED, final_attempts

# how a failed attempt ended, by the harness's precedence (tasks.rollout.harness.STOP_REASONS,
# infra errors aside: they are not graded)
FAILED_ENDINGS = ("timeout", "max_tokens", "format_error", "max_turns", "submitted")


def ending(attempt: dict[str, Any], turns: list[dict[str, Any]], max_turns: int | None, answer_env: bool) -> str:
    """The stop reason of one graded attempt, rebuilt from its sealed row and its turns, by the
    harness's precedence: ``timeout`` (status), ``max_tokens`` (the last reply was cut at
    ``max_new_tokens``, finish_reason ``length``, or the context budget ended it: its action has
    ``context_limit``), ``format_error`` (an answer-environment attempt with no answer at all: the sealed row's
    ``final_answer`` is empty),
    ``max_turns`` (it used every turn of a multi-turn harness and its last reply neither answered
    nor called a submit tool), else ``submitted``.

    Args:
        attempt: an ``evaluations`` row (``status``, ``final_answer``, ``num_turns``).
        turns: its ``turns`` rows, in turn order (non-empty).
        max_turns: the harness's turn limit; None for a single-reply harness (no limit to hit).
        answer_env: the task is graded on an answer (environment ``answer``).
    """
    if attempt["status"] == "timeout":
        return "timeout"
    last = turns[-1]
    act = json.loads(last["action"] or "{}")
    if last["finish_reason"] == "length" or act.get("context_limit"):
        return "max_tokens"
    if answer_env and not attempt["final_answer"]:
        return "format_error"
    submitted = act.get("answer") is not None or any(c.get("impl") == "submit" for c in act.get("calls", []))
    if max_turns is not None and len(turns) >= max_turns and not submitted:
        return "max_turns"
    return "submitted"


def _turn_counts(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Per attempt: turns the harness answered with its format-error message (a ``format_error``
    read span), turns with a tool call, with a failed tool call (``tool_status`` not all ``ok``;
    None when a turn with calls has no recorded status: turns written before it was recorded),
    and replies cut at ``max_new_tokens``."""
    fmt = tools = tool_err = cut = 0
    known = True
    for t in turns:
        act = json.loads(t["action"] or "{}")
        spans = json.loads(t["read_spans"]) if t["read_spans"] else []
        fmt += any(s.get("source") == "format_error" for s in spans)
        cut += t["finish_reason"] == "length"
        if act.get("calls"):
            tools += 1
            if "tool_status" not in act:
                known = False
            else:
                tool_err += any(s != "ok" for s in act["tool_status"])
    return {"format_error_turns": fmt, "tool_turns": tools, "tool_error_turns": tool_err if known else None,
            "truncated_turns": cut}


def _median(xs: list[int]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _mean(xs: list[int]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def step_failures(evaluations: list[dict[str, Any]], eval_turns: list[dict[str, Any]],
                  max_turns: dict[str, int | None], answer_tasks: set[str]) -> list[dict[str, Any]]:
    """Rows of the ``step_failures`` artifact, one per (checkpoint, harness_name) with a graded
    final attempt, sorted by checkpoint then harness.

    Over the cell's graded final attempts (``tasks.evaluate.stats.final_attempts``; status
    resolved, unresolved or timeout; infra errors are not graded): ``graded``, ``solved``
    (resolved), ``failed``; ``median_turns_solved``/``mean_turns_solved`` and
    ``median_turns_failed``/``mean_turns_failed`` (``num_turns``, agent steps; None where the cell
    has no such attempt); ``failed_<reason>`` for each of :data:`FAILED_ENDINGS`, the failed
    attempts by how they ended (:func:`ending`; ``failed_submitted``: a wrong answer given in
    time); over all graded attempts, ``format_error_turns`` (replies the harness answered with its
    format-error message), ``format_error_attempts`` (attempts with at least one), ``tool_turns``
    (turns with a tool call), ``tool_error_turns`` (a call whose program failed: non-zero exit,
    timeout, a limit), ``tool_error_attempts``, ``truncated_turns`` (replies cut at
    ``max_new_tokens``) and ``unparsed_answers`` (attempts whose answer was not in the harness's
    format: the last-number fallback or none). ``note`` says why a column is None.

    Args:
        evaluations: sealed ``evaluations`` rows.
        eval_turns: their ``turns`` rows (``episode_id`` = ``eval_id``).
        max_turns: harness_name -> its turn limit (None: a single-reply harness).
        answer_tasks: task_ids of the answer environment (where no answer is a format error).

    Where any graded attempt of a cell has no turn rows (a scripted runner records none), every
    turn-derived column of the cell is None with a note; so are the tool errors where a turn with
    calls carries no ``tool_status``.

    Raises:
        ValueError: an evaluated harness missing from ``max_turns``.
    """
    by_ep: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in eval_turns:
        by_ep[t["episode_id"]].append(t)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in final_attempts(evaluations).values():
        if r["status"] in GRADED:
            cells[(r["checkpoint"], r["harness_name"])].append(r)
    out = []
    for (ck, h), rows in sorted(cells.items()):
        if h not in max_turns:
            raise ValueError(f"harness {h!r} of the evaluations has no turn limit in max_turns {sorted(max_turns)}")
        solved = [int(r["num_turns"]) for r in rows if r["resolved"]]
        failed_rows = [r for r in rows if not r["resolved"]]
        failed = [int(r["num_turns"]) for r in failed_rows]
        row: dict[str, Any] = {
            "checkpoint": ck, "harness_name": h, "graded": len(rows), "solved": len(solved), "failed": len(failed),
            "median_turns_solved": _median(solved), "mean_turns_solved": _mean(solved),
            "median_turns_failed": _median(failed), "mean_turns_failed": _mean(failed),
            **{f"failed_{e}": None for e in FAILED_ENDINGS},
            "format_error_turns": None, "format_error_attempts": None, "tool_turns": None, "tool_error_turns": None,
            "tool_error_attempts": None, "truncated_turns": None,
            "unparsed_answers": sum(not r["answer_parsed"] for r in rows), "note": ""}
        notes = []
        if not solved:
            notes.append("no solved attempt: turns per solved attempt n/a")
        if not failed:
            notes.append("no failed attempt: turns per failed attempt n/a")
        missing = sum(not by_ep.get(r["eval_id"]) for r in rows)
        if missing:
            notes.append(f"{missing} of {len(rows)} graded attempts have no turn rows: endings and turn errors n/a")
        else:
            turns_of = {r["eval_id"]: sorted(by_ep[r["eval_id"]], key=lambda t: t["turn_idx"]) for r in rows}
            ends = [ending(r, turns_of[r["eval_id"]], max_turns[h], r["task_id"] in answer_tasks) for r in failed_rows]
            row.update({f"failed_{e}": ends.count(e) for e in FAILED_ENDINGS})
            per = [_turn_counts(turns_of[r["eval_id"]]) for r in rows]
            row.update(format_error_turns=sum(p["format_error_turns"] for p in per),
                       format_error_attempts=sum(p["format_error_turns"] > 0 for p in per),
                       tool_turns=sum(p["tool_turns"] for p in per),
                       truncated_turns=sum(p["truncated_turns"] for p in per))
            if all(p["tool_error_turns"] is not None for p in per):
                row.update(tool_error_turns=sum(p["tool_error_turns"] for p in per),
                           tool_error_attempts=sum(p["tool_error_turns"] > 0 for p in per))
            else:
                notes.append("tool calls without a recorded exec status (turns from before action.tool_status): "
                             "tool errors n/a")
        row["note"] = "; ".join(notes)
        out.append(row)
    return out
