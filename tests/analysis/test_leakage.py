import json
import math

import numpy as np
import pytest

from tasks.analysis.leakage import (action_distributions, action_kind, harness_leakage, jsd_bits, jsd_table,
                                    zero_advantage_fractions)
from tasks.harnesses.actions import ParsedReply, ToolCall


def ep(task, harness, reward, status="ok"):
    return {"task_id": task, "harness_id": f"id-{harness}", "harness_name": harness, "reward": float(reward),
            "status": status}


def test_zero_advantage_fractions_hand_example():
    eps = [
        # t1: every reward 1 -> both Within groups and the Cross group are zero-signal
        ep("t1", "A", 1), ep("t1", "A", 1), ep("t1", "B", 1), ep("t1", "B", 1),
        # t2: mixed in both harnesses -> no zero group
        ep("t2", "A", 1), ep("t2", "A", 0), ep("t2", "B", 0), ep("t2", "B", 1),
        # t3: after dropping infra_error and timeout (as the trainer does) only one sample is left
        ep("t3", "A", 1), ep("t3", "A", 0, "infra_error"), ep("t3", "B", 0, "timeout"),
        # t4: B all-equal (zero under Within), pooled with A's mixed rewards under Cross
        ep("t4", "A", 1), ep("t4", "A", 0), ep("t4", "B", 1), ep("t4", "B", 1),
    ]
    rows = {r["rule"]: r for r in zero_advantage_fractions(eps)}
    w, c = rows["within"], rows["cross"]
    assert w["n_samples"] == c["n_samples"] == 13
    # Within groups: t1|A t1|B t2|A t2|B t3|A t4|A t4|B; zero: t1|A t1|B t3|A t4|B
    assert (w["n_groups"], w["zero_groups"], w["fraction"]) == (7, 4, pytest.approx(4 / 7))
    assert (w["zero_samples"], w["sample_fraction"]) == (7, pytest.approx(7 / 13))
    # Cross groups: t1 t2 t3 t4; zero: t1 and the singleton t3
    assert (c["n_groups"], c["zero_groups"], c["fraction"]) == (4, 2, pytest.approx(0.5))
    assert (c["zero_samples"], c["sample_fraction"]) == (5, pytest.approx(5 / 13))
    none = {r["rule"]: r for r in zero_advantage_fractions(eps, scale="none")}
    assert none["within"]["zero_groups"] == 4 and none["cross"]["zero_groups"] == 2


def test_zero_advantage_fractions_rejects_bad_input():
    with pytest.raises(ValueError, match="status 'ok'"):
        zero_advantage_fractions([ep("t", "A", 1, "infra_error")])
    with pytest.raises(ValueError, match="grouping|rule"):
        zero_advantage_fractions([ep("t", "A", 1)], rules=("by_magic",))
    bad = ep("t", "A", 1)
    del bad["harness_id"]
    with pytest.raises(ValueError, match="harness_id"):
        zero_advantage_fractions([bad])


def _two_harnesses(pa, pb, tasks=25, per=4, seed=1):
    """``tasks`` tasks x 2 harnesses x ``per`` samples: 200 episodes by default."""
    rng = np.random.default_rng(seed)
    return [ep(f"t{t}", h, float(rng.random() < p)) for t in range(tasks) for h, p in (("A", pa), ("B", pb))
            for _ in range(per)]


def test_leakage_under_cross_when_success_rates_differ_but_not_under_within():
    eps = _two_harnesses(0.8, 0.1)
    cross = harness_leakage(eps, "cross", permutations=20, seed=0)
    within = harness_leakage(eps, "within", permutations=20, seed=0)
    assert (cross["n_samples"], cross["n_classes"], cross["chance"], cross["folds"]) == (200, 2, 0.5, 5)
    # positive advantages mostly come from A, negative from B: far above the shuffled null
    assert cross["leakage_pp"] > 20 and cross["ci_low_pp"] > 0
    assert cross["p_value"] == pytest.approx(1 / 21)  # no shuffled labelling did as well
    assert cross["leakage_pp"] == pytest.approx(100 * (cross["accuracy"] - cross["null_mean"]))
    # Within: every (task, harness) group has mean-0 advantages, so nothing to learn
    assert abs(within["leakage_pp"]) < 10 and within["ci_low_pp"] <= 0


def test_no_leakage_when_success_rates_are_equal():
    r = harness_leakage(_two_harnesses(0.4, 0.4), "cross", permutations=20, seed=0)
    assert r["ci_low_pp"] <= 0 <= r["ci_high_pp"] and abs(r["leakage_pp"]) < 10
    assert r["ci_low_pp"] <= r["leakage_pp"] <= r["ci_high_pp"]


def test_leakage_is_deterministic_and_uses_only_ok_episodes():
    eps = _two_harnesses(0.7, 0.2, tasks=6, per=2) + [ep("t0", "A", 1, "infra_error")]
    a = harness_leakage(eps, "cross", folds=3, permutations=5, seed=4)
    assert a == harness_leakage(eps, "cross", folds=3, permutations=5, seed=4)
    assert a["n_samples"] == 24 and a["folds"] == 3 and a["permutations"] == 5


def test_leakage_not_computable_raises():
    with pytest.raises(ValueError, match=">= 2 harnesses"):
        harness_leakage([ep("t", "A", 1), ep("t", "A", 0)], "cross", permutations=2)
    with pytest.raises(ValueError, match="'B': 1"):
        harness_leakage([ep("t", "A", 1), ep("t", "A", 0), ep("t", "B", 1), ep("t", "B", 0, "infra_error")], "cross",
                        permutations=2)


def _action(calls=(), answer=None, error=None):
    return json.dumps(ParsedReply([ToolCall(t, i, {}) for t, i in calls], answer, error).to_json())


@pytest.mark.parametrize("action,kind", [
    (_action(answer="42"), "answer"),
    (_action(answer=""), "answer"),
    (_action(calls=[("run", "python")]), "python"),
    (_action(calls=[("bash", "shell"), ("run", "python")]), "python+shell"),
    (_action(calls=[("run", "python"), ("run2", "python")]), "python"),
    (_action(calls=[("done", "submit")], answer="x"), "submit"),
    (_action(error="could not parse the tool call"), "format_error"),
    (_action(), "none"),
])
def test_action_kind(action, kind):
    assert action_kind(action) == kind


def test_action_kind_rejects_malformed_actions():
    with pytest.raises(ValueError, match="not valid JSON"):
        action_kind("{calls")
    with pytest.raises(ValueError, match="impl"):
        action_kind(json.dumps({"calls": [{"tool": "x"}], "answer": None, "error": None}))


def test_action_distributions_counts_labelled_turns():
    turns = [{"episode_id": "e1", "action": _action(calls=[("run", "python")])},
             {"episode_id": "e1", "action": _action(answer="3")},
             {"episode_id": "e2", "action": _action(calls=[("run", "python")])},
             {"episode_id": "train-1", "action": _action(answer="9")}]
    d = action_distributions(turns, {"e1": ("base", "h1"), "e2": ("step1", "h1")})
    assert d == {("base", "h1"): {"answer": 1, "python": 1}, ("step1", "h1"): {"python": 1}}


def test_jsd_bits():
    assert jsd_bits({"a": 3, "b": 1}, {"a": 6, "b": 2}) == pytest.approx(0.0, abs=1e-12)
    assert jsd_bits({"a": 5}, {"b": 2}) == pytest.approx(1.0, abs=1e-12)
    # P = (1, 0), Q = (1/2, 1/2): JSD = H(M) - (H(P) + H(Q))/2 with M = (3/4, 1/4)
    hand = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)) - 0.5
    assert jsd_bits({"a": 1}, {"a": 1, "b": 1}) == pytest.approx(hand, abs=1e-12)
    assert hand == pytest.approx(0.311278124459, abs=1e-11)
    with pytest.raises(ValueError, match="-1"):
        jsd_bits({"a": -1, "b": 2}, {"a": 1})
    with pytest.raises(ValueError, match="total weight 0"):
        jsd_bits({"a": 0}, {"a": 1})


def test_jsd_table_pairs():
    dists = {("base", "h1"): {"python": 2}, ("base", "h2"): {"shell": 4},
             ("step1", "h1"): {"python": 1, "answer": 1}, ("step1", "h3"): {}}
    rows = jsd_table(dists)
    got = [(r["scope"], r["checkpoint_a"], r["harness_a"], r["checkpoint_b"], r["harness_b"]) for r in rows]
    assert got == [("between_harnesses", "base", "h1", "base", "h2"),
                   ("between_checkpoints", "base", "h1", "step1", "h1")]
    assert rows[0]["jsd_bits"] == pytest.approx(1.0) and (rows[0]["n_a"], rows[0]["n_b"]) == (2, 4)
    assert rows[1]["jsd_bits"] == pytest.approx(0.311278124459, abs=1e-11)
