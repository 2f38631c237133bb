"""The harness table's figures (benchmarks/task_difficulty.py): a cell's tool-call rate counts
episodes with a parsed tool call, and a family's harness spread is its best minus its worst pass@1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from task_difficulty import FAMILIES, cell_row, harness_spread  # noqa: E402


def _ep(i, task, success, parsed):
    return {"episode_id": f"e{i}", "record": {"task_id": task}, "success": success, "answer_parsed": parsed}


def _turn(i, calls, finish="stop"):
    return {"episode_id": f"e{i}", "action": json.dumps({"calls": calls}), "finish_reason": finish,
            "completion_token_ids": [1, 2]}


def test_a_cell_counts_tool_calls_parse_rate_and_accuracy_given_parsed():
    eps = [_ep(0, "t0", True, True), _ep(1, "t0", False, True), _ep(2, "t1", False, False), _ep(3, "t1", False, False)]
    call = [{"tool": "calculate", "impl": "calculate", "args": {"expression": "1"}}]
    # episode 0 called the tool on its first turn, episode 2 only on its second; 1 and 3 never
    turns = [_turn(0, call), _turn(0, []), _turn(1, []), _turn(2, []), _turn(2, call), _turn(3, [], "length")]
    row = cell_row("products-2d", "calculator-demo", eps, turns, 1.0)
    assert row["tool_call_rate"] == 0.5 and row["parse_rate"] == 0.5 and row["acc_given_parsed"] == 0.5
    assert row["pass_at_1"] == 0.25 and row["pass_at_k"] == 0.5 and row["mean_turns"] == 1.5
    assert row["cut_frac"] == round(1 / 6, 4)


def test_the_spread_is_the_best_minus_the_worst_harness_per_family():
    cells = [{"family": "a", "harness": "direct", "pass_at_1": 0.05}, {"family": "a", "harness": "python-demo", "pass_at_1": 0.4},
             {"family": "a", "harness": "boxed", "pass_at_1": 0.0}, {"family": "b", "harness": "direct", "pass_at_1": 0.2}]
    sp = harness_spread(cells)
    assert sp["a"] == {"max": 0.4, "max_harness": "python-demo", "min": 0.0, "min_harness": "boxed", "spread": 0.4}
    assert sp["b"]["spread"] == 0.0 and list(sp) == ["a", "b"]


def test_the_tool_family_is_two_factor_products():
    assert FAMILIES["products-2d"] == ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2})
