"""P2 acceptance rule and replay arithmetic on hand-made score sets."""

import pytest

from tasks.bipa.replay import AcceptRule, effect_rows, replay_table, selection_effect, set_mean


def test_rule_rejects_ties_and_needs_the_margin():
    r = AcceptRule()
    assert r.accepts(0.5, 0.25) is True
    assert r.accepts(0.5, 0.5) is False  # tie rejected
    assert r.accepts(0.25, 0.5) is False
    m = AcceptRule(better_by=0.05)
    assert m.accepts(0.55, 0.5) is False  # exactly the margin (0.0500000000000000444 in floats): a tie
    assert m.accepts(0.6, 0.5) is True and m.accepts(0.54, 0.5) is False
    with pytest.raises(ValueError, match="candidate_mean=1.5"):
        r.accepts(1.5, 0.5)
    with pytest.raises(ValueError, match="better_by"):
        AcceptRule(better_by=-0.1)


def test_set_mean_is_order_free():
    a = {"x": 0.1, "y": 0.2, "z": 0.3}
    b = {"z": 0.3, "x": 0.1, "y": 0.2}
    assert set_mean(a) == set_mean(b) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no task scores"):
        set_mean({})


def test_selection_effect_exact_and_degenerate_interval():
    sel = [{"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 1.0}]
    fresh = [{"a": 0.5, "b": 0.5}, {"a": 0.0, "b": 1.0}]
    eff, lo, hi = selection_effect(sel, fresh, paired=True, bootstrap=0, seed=0)
    assert eff == pytest.approx((0.25 + 0.5) / 2) and lo is None and hi is None
    # a constant per-task difference: every resample gives it, so the interval is a point
    eff, lo, hi = selection_effect([{"a": 1.0, "b": 0.5}], [{"a": 0.75, "b": 0.25}], paired=True, bootstrap=200, seed=3)
    assert (eff, lo, hi) == (pytest.approx(0.25), pytest.approx(0.25), pytest.approx(0.25))
    e1 = selection_effect(sel, fresh, paired=True, bootstrap=500, seed=7)
    assert e1 == selection_effect(sel, fresh, paired=True, bootstrap=500, seed=7)
    assert e1[1] <= e1[0] <= e1[2] and e1[1] < e1[2]
    assert selection_effect([], [], paired=True, bootstrap=10, seed=0) == (None, None, None)
    with pytest.raises(ValueError, match="same tasks"):
        selection_effect([{"a": 1.0}], [{"b": 1.0}], paired=True, bootstrap=10, seed=0)


def test_replay_reapplies_the_rule_per_set():
    cands = [
        {"candidate_idx": 0, "parent_idx": -1, "decision": "seed"},
        {"candidate_idx": 1, "parent_idx": 0, "decision": "accepted"},
        {"candidate_idx": 2, "parent_idx": 1, "decision": "rejected"},
        {"candidate_idx": 3, "parent_idx": 1, "decision": "accepted"},
        {"candidate_idx": 4, "parent_idx": 3, "decision": "invalid"},
    ]
    scores = {
        "selection": {0: {"a": 0.0, "b": 0.5}, 1: {"a": 0.5, "b": 0.5}, 2: {"a": 0.5, "b": 0.0},
                      3: {"a": 1.0, "b": 0.5}},
        "fresh": {0: {"a": 0.5, "b": 0.5}, 1: {"a": 0.5, "b": 0.5}, 2: {"a": 1.0, "b": 1.0},
                  3: {"a": 1.0, "b": 0.5}},
        "test": {0: {"c": 0.0}, 1: {"c": 1.0}, 2: {"c": 0.0}, 3: {"c": 0.5}},
    }
    rows = replay_table(cands, scores, AcceptRule())
    by = {(r["candidate_idx"], r["score_set"]): r for r in rows}
    assert len(rows) == 12 and (4, "fresh") not in by
    assert by[(0, "fresh")]["rule_accepts"] is None and by[(0, "fresh")]["parent_mean"] is None
    assert by[(1, "selection")]["rule_accepts"] is True
    assert by[(1, "fresh")]["rule_accepts"] is False  # 0.5 vs 0.5: a tie on fresh seeds
    assert by[(2, "fresh")]["rule_accepts"] is True  # rejected at selection, better on fresh
    assert by[(3, "fresh")]["rule_accepts"] is True and by[(3, "test")]["rule_accepts"] is False
    assert by[(1, "test")]["accepted_at_selection"] is True and by[(2, "test")]["accepted_at_selection"] is False
    eff = {r["score_set"]: r for r in effect_rows(cands, scores, AcceptRule(), bootstrap=0, seed=0)}
    # accepted: 1 (sel 0.5, fresh 0.5, test 1.0) and 3 (sel 0.75, fresh 0.75, test 0.5)
    assert eff["fresh"]["n_accepted"] == 2 and eff["fresh"]["still_accepted"] == 1
    assert eff["fresh"]["selection_effect"] == pytest.approx(0.0)
    assert eff["test"]["still_accepted"] == 1  # 1: 1.0 > 0.0; 3: 0.5 < 1.0
    assert eff["test"]["selection_effect"] == pytest.approx(((0.5 - 1.0) + (0.75 - 0.5)) / 2)
