"""P6's steps and failure-mode table (tasks.analysis.steps), on attempts whose numbers are counted
by hand."""

import json

import pytest

from tasks.analysis.steps import ending, step_failures


def _ev(eid, ck, h, status, turns, answer="7", parsed=True, record=None, attempt=0, retry=0):
    return {"eval_id": eid, "checkpoint": ck, "harness_name": h, "record_id": record or eid, "task_id": "t-" + eid,
            "attempt": attempt, "retry": retry, "status": status, "resolved": status == "resolved",
            "num_turns": turns, "final_answer": answer, "answer_parsed": parsed}


def _t(eid, i, calls=None, answer=None, status=None, fmt=False, finish="stop", context_limit=False):
    act = {"calls": [{"tool": "python", "impl": "python", "args": {}}] * len(calls or []) if calls else [],
           "answer": answer, "error": None}
    if calls:
        act["tool_status"] = calls if status is None else status
    if context_limit:
        act["context_limit"] = True
    spans = [{"source": "format_error", "turn": i + 1}] if fmt else []
    return {"episode_id": eid, "turn_idx": i, "action": json.dumps(act), "read_spans": json.dumps(spans),
            "finish_reason": finish}


def _data():
    ev = [
        _ev("e1", "base", "react", "resolved", 2),                                   # solved in 2
        _ev("e2", "base", "react", "resolved", 1),                                   # solved in 1
        _ev("e3", "base", "react", "unresolved", 3, answer="5", parsed=False),       # out of turns
        _ev("e4", "base", "react", "unresolved", 1, answer="", parsed=False),        # cut at the token limit
        _ev("e5", "base", "react", "timeout", 3, answer="", parsed=False),           # timed out
        _ev("e6", "base", "react", "infra_error", 1, answer="", parsed=False),       # not graded
        _ev("e7", "base", "react", "unresolved", 2),                                 # wrong answer in time
        _ev("e8", "base", "react", "infra_error", 1, record="r8", attempt=1),        # retried ...
        _ev("e8b", "base", "react", "resolved", 3, record="r8", attempt=1, retry=1),  # ... and solved in 3
        _ev("d1", "gspo", "direct", "resolved", 1),
        _ev("d2", "gspo", "direct", "unresolved", 1, answer="", parsed=False),       # nothing to grade
        _ev("d3", "gspo", "direct", "unresolved", 1, answer="4"),
    ]
    tu = [
        _t("e1", 0, calls=["ok"]), _t("e1", 1, answer="7"),
        _t("e2", 0, answer="7"),
        _t("e3", 0, fmt=True), _t("e3", 1, calls=["error"]), _t("e3", 2),
        _t("e4", 0, finish="length"),
        _t("e5", 0, calls=["ok"]), _t("e5", 1), _t("e5", 2),
        _t("e7", 0, calls=["timeout"]), _t("e7", 1, answer="3"),
        _t("e8b", 2, answer="7"), _t("e8b", 0, calls=["ok"]), _t("e8b", 1, calls=["ok"]),
        _t("d1", 0, answer="7"), _t("d2", 0), _t("d3", 0, answer="4"),
    ]
    return ev, tu


def test_steps_and_failure_modes_counted_by_hand():
    ev, tu = _data()
    rows = step_failures(ev, tu, {"react": 3, "direct": None}, {"t-" + e["eval_id"] for e in ev})
    assert [(r["checkpoint"], r["harness_name"]) for r in rows] == [("base", "react"), ("gspo", "direct")]
    b, d = rows
    # graded: e1 e2 e3 e4 e5 e7 e8b (e6 and e8 are infra errors; e8b is e8's retry)
    assert (b["graded"], b["solved"], b["failed"]) == (7, 3, 4)
    # solved turns 2, 1, 3; failed turns 3, 1, 3, 2
    assert (b["median_turns_solved"], b["mean_turns_solved"]) == (2.0, 2.0)
    assert (b["median_turns_failed"], b["mean_turns_failed"]) == (2.5, 2.25)
    assert {k: b[f"failed_{k}"] for k in ("timeout", "max_tokens", "format_error", "max_turns", "submitted")} == \
        {"timeout": 1, "max_tokens": 1, "format_error": 0, "max_turns": 1, "submitted": 1}
    assert (b["format_error_turns"], b["format_error_attempts"]) == (1, 1)
    # tool calls: e1 t0, e3 t1, e5 t0, e7 t0, e8b t0 and t1; failed: e3 t1 (error), e7 t0 (timeout)
    assert (b["tool_turns"], b["tool_error_turns"], b["tool_error_attempts"]) == (6, 2, 2)
    assert (b["truncated_turns"], b["unparsed_answers"]) == (1, 3)
    assert b["note"] == ""
    assert (d["graded"], d["solved"], d["failed"], d["median_turns_solved"], d["median_turns_failed"]) == (3, 1, 2, 1.0, 1.0)
    # a single-reply harness has no turn limit: d2 (no answer) is a format error, d3 a wrong answer
    assert (d["failed_format_error"], d["failed_submitted"], d["failed_max_turns"]) == (1, 1, 0)
    assert (d["tool_turns"], d["tool_error_turns"], d["unparsed_answers"]) == (0, 0, 1)


def test_missing_turns_and_tool_status_are_na_with_a_note():
    ev, tu = _data()
    ev = [e for e in ev if e["checkpoint"] == "base"]
    no_e7 = [t for t in tu if t["episode_id"] != "e7"]
    (b,) = step_failures(ev, no_e7, {"react": 3}, set())
    assert b["failed_submitted"] is None and b["tool_turns"] is None and b["truncated_turns"] is None
    assert b["median_turns_failed"] == 2.5  # from the sealed rows, turns or not
    assert "1 of 7 graded attempts have no turn rows" in b["note"]
    old = []
    for t in tu:
        a = json.loads(t["action"])
        a.pop("tool_status", None)
        old.append({**t, "action": json.dumps(a)})
    (b,) = step_failures(ev, old, {"react": 3}, set())
    assert b["tool_error_turns"] is None and b["tool_turns"] == 6 and "tool errors n/a" in b["note"]


def test_no_solved_attempt_is_na_and_an_unknown_harness_raises():
    ev = [_ev("x", "base", "react", "unresolved", 2)]
    (r,) = step_failures(ev, [_t("x", 0), _t("x", 1, answer="1")], {"react": 3}, {"t-x"})
    assert r["median_turns_solved"] is None and r["mean_turns_solved"] is None
    assert r["note"].startswith("no solved attempt")
    with pytest.raises(ValueError, match="harness 'react' of the evaluations has no turn limit"):
        step_failures(ev, [], {"direct": None}, set())


def test_ending_precedence():
    a = _ev("x", "base", "react", "unresolved", 3, answer="")
    # a cut reply outranks no answer; the context limit counts as a cut
    assert ending(a, [_t("x", 0), _t("x", 1), _t("x", 2, finish="length")], 3, True) == "max_tokens"
    assert ending(a, [_t("x", 0), _t("x", 1), _t("x", 2, context_limit=True)], 3, True) == "max_tokens"
    assert ending(a, [_t("x", 0), _t("x", 1), _t("x", 2)], 3, True) == "format_error"
    # off the answer environment an empty answer is no format error: out of turns
    assert ending(a, [_t("x", 0), _t("x", 1), _t("x", 2)], 3, False) == "max_turns"
    # an answer on the last turn is a submission, not the turn limit
    assert ending({**a, "final_answer": "2"}, [_t("x", 0), _t("x", 1), _t("x", 2, answer="2")], 3, True) == "submitted"
    assert ending({**a, "status": "timeout"}, [_t("x", 0, finish="length")], 3, True) == "timeout"


def test_report_section_shows_steps_endings_and_na():
    from tasks.analysis.report import step_failures_section

    ev, tu = _data()
    rows = step_failures(ev, tu, {"react": 3, "direct": None}, {"t-" + e["eval_id"] for e in ev})
    md = "\n".join(step_failures_section(rows))
    assert "| base | react | 7 | 3 | 2.0 (2.00) | 2.5 (2.25) |" in md
    # base/react: 4 failed, one each of wrong answer, turn limit, token limit, timeout; none without an answer
    assert "| base | react | 4 | 1 (0.25) | 1 (0.25) | 1 (0.25) | 0 (0.00) |" in md
    # gspo/direct: 2 failed, one wrong answer, one with no answer
    assert "| gspo | direct | 2 | 1 (0.50) | 0 (0.00) | 0 (0.00) | 1 (0.50) |" in md
    assert "n/a because" not in md
    (b,) = step_failures(ev[:1], tu, {"react": 3}, set())
    md = "\n".join(step_failures_section([b]))
    # n/a with its reason (a short one stays in the cell)
    assert "| base | react | 1 | 1 | 2.0 (2.00) | n/a (no failed attempt) |" in md
    assert step_failures_section([]) == []


def test_steps_plot_draws_cells_with_and_without_numbers():
    from tasks.analysis.plots import steps_plot

    ev, tu = _data()
    rows = step_failures(ev, tu, {"react": 3, "direct": None}, {"t-" + e["eval_id"] for e in ev})
    na = step_failures(ev[:1], [], {"react": 3}, set())  # no failed attempt, no turns: n/a bars stay empty
    png = steps_plot(rows + [{**na[0], "checkpoint": "x"}])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == steps_plot(rows + [{**na[0], "checkpoint": "x"}])
    assert steps_plot([]) is None
