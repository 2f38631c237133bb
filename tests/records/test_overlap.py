"""Held-out means held out: overlap counts, the disjoint split, the exact reward."""

import json

import pytest

from tasks.config import RunConfig
from tasks.records.freeze import freeze_tables
from tasks.records.overlap import overlap_rows, problem_key
from tasks.records.verifiers import exact_answer_reward, score

# learn-arith's suite: 240 draws of two 1-digit terms repeat many expressions
_ARITH = {"name": "basic_arithmetic", "size": 240, "seed": 0,
          "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def _cfg(disjoint: bool, suites=None, test_fraction=0.5):
    return RunConfig.model_validate(dict(name="t", suites=suites or [_ARITH], harnesses=["direct"],
                                         split={"test_fraction": test_fraction, "disjoint": disjoint}))


def _brute_force(tasks):
    """The counts by a plain double loop, independent of overlap_rows' sets."""
    train = [t for t in tasks if t["split"] == "train"]
    test = [t for t in tasks if t["split"] == "test"]
    same_prompt = sum(any(" ".join(a["instruction"].split()) == " ".join(b["instruction"].split()) for b in train)
                      for a in test)

    def expr(t):
        e = json.loads(t["metadata"])["expression"].replace(" ", "")
        while e.startswith("(") and e.endswith(")") and e[1:-1].count("(") == e[1:-1].count(")"):
            e = e[1:-1]
        return e

    same_problem = sum(any(expr(a) == expr(b) for b in train) for a in test)
    return same_prompt, same_problem


def test_the_hash_split_of_learn_arith_leaks_and_the_counts_say_how_much():
    tasks, _, _ = freeze_tables(_cfg(False))
    (row,) = overlap_rows(tasks, False)
    assert (row["n_train"], row["n_test"]) == (120, 120)
    assert (row["test_same_prompt"], row["test_same_problem"]) == _brute_force(tasks)
    # learn-arith's split today: 7 test prompts verbatim in train, 11 sharing an expression
    assert (row["test_same_prompt"], row["test_same_problem"]) == (7, 11)


def test_the_disjoint_split_shares_nothing_and_keeps_the_test_fraction():
    tasks, _, records = freeze_tables(_cfg(True))
    (row,) = overlap_rows(tasks, True)
    assert row["test_same_prompt"] == row["test_same_problem"] == 0 == sum(_brute_force(tasks))
    assert row["disjoint"] is True
    assert 120 <= row["n_test"] <= 130 and row["n_train"] + row["n_test"] == 240
    # same content, other loader order: same sides
    again, _, _ = freeze_tables(_cfg(True))
    assert {t["task_hash"]: t["split"] for t in again} == {t["task_hash"]: t["split"] for t in tasks}
    assert {r["split"] for r in records} == {"train", "test"}


def test_problem_key_reads_the_expression_not_the_wording():
    a = {"suite": "s", "instruction": "Calculate ( -9 / 9 ).", "metadata": json.dumps({"expression": "( -9 / 9 )"})}
    b = {"suite": "s", "instruction": "Work out -9/9 please", "metadata": json.dumps({"expression": "-9/9"})}
    c = {"suite": "s", "instruction": "Calculate 9 / -9.", "metadata": json.dumps({"expression": "9 / -9"})}
    assert problem_key(a) == problem_key(b) != problem_key(c)
    assert problem_key({**a, "suite": "other"}) != problem_key(a)
    t1 = {"suite": "s", "instruction": "How many  legs?", "metadata": "{}"}
    assert problem_key(t1) == problem_key({**t1, "instruction": "how many legs?"})


def test_an_eval_only_suite_drawing_train_problems_is_refused_under_disjoint():
    suites = [_ARITH, {**_ARITH, "seed": 1, "size": 40, "eval_only": True}]
    with pytest.raises(ValueError, match=r"split.disjoint: suite 'reasoning_gym/basic_arithmetic' has \d+ test task"):
        freeze_tables(_cfg(True, suites=suites))
    tasks, _, _ = freeze_tables(_cfg(False, suites=suites))  # without the flag: counted, not refused
    assert overlap_rows(tasks, False)[0]["test_same_problem"] > 0


def test_exact_reward_gives_no_partial_credit_where_score_answer_does():
    tasks, _, _ = freeze_tables(_cfg(False, suites=[{**_ARITH, "size": 40, "reward": "exact"}]))
    t = next(t for t in tasks if json.loads(t["verifier_spec"])["answer"] == "2")
    spec = json.loads(t["verifier_spec"])
    assert spec["reward"] == "exact"
    assert score("reasoning_gym", spec, "2") == 1.0
    assert score("reasoning_gym", spec, "2.0") == 1.0
    assert score("reasoning_gym", spec, "-2") == 0.0 and score("reasoning_gym", spec, "12") == 0.0
    partial = {k: v for k, v in spec.items() if k != "reward"}
    assert score("reasoning_gym", partial, "-2") == 0.5  # reasoning-gym's own rule, kept as the default
    assert exact_answer_reward("1,000", "1000") == 1.0 and exact_answer_reward("abc", "ABC") == 1.0
    assert exact_answer_reward("3", "3.5") == 0.0


def test_exact_reward_is_refused_where_there_is_no_reference_answer():
    with pytest.raises(ValueError, match="reward='exact'"):
        RunConfig.model_validate(dict(name="t", suites=[{"source": "humaneval", "name": "HumanEval", "size": 2,
                                                         "reward": "exact"}], harnesses=["direct"]))


def test_default_task_hashes_do_not_change_with_the_reward_option():
    default, _, _ = freeze_tables(_cfg(False, suites=[{**_ARITH, "size": 10}]))
    assert "reward" not in json.loads(default[0]["verifier_spec"])
    exact, _, _ = freeze_tables(_cfg(False, suites=[{**_ARITH, "size": 10, "reward": "exact"}]))
    assert {t["task_hash"] for t in default}.isdisjoint({t["task_hash"] for t in exact})
