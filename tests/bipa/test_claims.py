"""P2's claims on hand-made sealed rows: the selection effect's sign, the placebo as its control,
the Bonferroni level, and n/a where a value is undefined."""

import pytest

from tasks.bipa.claims import decisions, finding_table
from tasks.bipa.replay import selection_effect

N = 12
SEL, TEST = [f"t{i:02d}" for i in range(N)], [f"u{i:02d}" for i in range(N)]


def _cand(name, arm, hid, parent="seed"):
    return {"kind": "candidate", "name": name, "arm": arm, "opt_seed": None, "round": None,
            "parent": None if arm == "seed" else parent, "harness_id": hid}


def _eps(hid, score_set, rewards, tokens=100, turns=2):
    tasks = TEST if score_set == "test" else SEL
    return [{"kind": "episode", "score_set": score_set, "harness_id": hid, "task_id": t, "sample": 0, "reward": r,
             "input_tokens": tokens, "turns": turns} for t, r in zip(tasks, rewards)]


def _plan(rules, alpha=0.05):
    return {"accept": {"better_by": 0.0}, "rewrite": {"seeds": [], "rounds": 0},
            "findings": {"alpha": alpha, "bootstrap_resamples": 500, "seed": 7, "rules": rules}}


EFFECT = {"name": "eff", "headline": "h", "measure": "selection_effect", "arm": "all", "score_set": "fresh",
          "claim": "increase", "margin": 0.0}


def _rows(a_sel, a_fresh, placebo_sel=(0,) * N):
    zero = [0.0] * N
    rows = [_cand("seed", "seed", "h0"), _cand("a", "pool", "h1"), _cand("placebo", "placebo", "h2")]
    for hid, sel, fresh in (("h0", zero, zero), ("h1", a_sel, a_fresh), ("h2", placebo_sel, zero)):
        rows += _eps(hid, "selection", sel) + _eps(hid, "fresh", fresh) + _eps(hid, "test", zero)
    return rows


def test_selection_effect_sign_on_a_hand_made_case():
    # accepted at selection with gain 1.0, gain 0.5 on fresh samples: the gain shrank by 0.5
    (f,) = finding_table(_plan([EFFECT]), _rows([1] * N, [0.5] * N))
    assert (f["estimate"], f["n_candidates"], f["learned"]) == (0.5, 1, '["a"]')
    assert f["ci_low"] == f["ci_high"] == 0.5  # no task varies
    # the gain grew on fresh samples: the effect is negative, and the rule reads it as not reproduced
    (g,) = finding_table(_plan([EFFECT]), _rows([0.5] * N, [1] * N))
    assert g["estimate"] == -0.5 and g["verdict"] == "not reproduced"


def test_the_placebo_is_the_control_accepted_or_not():
    rows = _rows([1] * N, [0] * N, placebo_sel=(1, 1, 1) + (0,) * (N - 3))  # the placebo won at selection by luck
    dec = {c["name"]: c["decision"] for c in decisions(_plan([EFFECT]), rows)}
    assert dec == {"seed": "seed", "a": "accepted", "placebo": "accepted"}
    (f,) = finding_table(_plan([EFFECT]), rows)
    assert f["learned"] == '["a"]'  # the placebo never counts among the accepted candidates
    assert f["control"] == 0.25 and f["estimate"] == 1.0  # its selection gain 0.25, fresh gain 0


def test_bonferroni_level_is_used_for_every_interval():
    a_sel, a_fresh = [1, 0, 1, 1, 0.5, 1, 0, 1, 1, 0.5, 1, 1], [0, 1, 0, 1, 0, 0.5, 0, 1, 0, 0, 1, 0.5]
    rules = [EFFECT, {**EFFECT, "name": "eff-test", "score_set": "test"}, {**EFFECT, "name": "eff3"}]
    fs = finding_table(_plan(rules, alpha=0.06), _rows(a_sel, a_fresh))
    assert [f["level"] for f in fs] == [pytest.approx(0.98)] * 3
    gain_sel = [{t: float(r) for t, r in zip(SEL, a_sel)}]
    gain_fresh = [{t: float(r) for t, r in zip(SEL, a_fresh)}]
    want = selection_effect(gain_sel, gain_fresh, paired=True, bootstrap=500, seed=fs[0]["seed"], level=0.98)
    assert (fs[0]["estimate"], fs[0]["ci_low"], fs[0]["ci_high"]) == want
    at95 = selection_effect(gain_sel, gain_fresh, paired=True, bootstrap=500, seed=fs[0]["seed"], level=0.95)
    assert at95[2] - at95[1] < want[2] - want[1]  # the corrected interval is the wider one


def test_undefined_values_are_n_a_with_a_reason():
    rules = [EFFECT, {"name": "pool", "headline": "h", "measure": "learned_minus_seed", "arm": "pool",
                      "claim": "no_increase", "margin": 0.05}]
    fs = finding_table(_plan(rules), _rows([0] * N, [0] * N))  # nothing beats the seed
    for f in fs:
        assert f["estimate"] is None and f["ci_low"] is None and f["verdict"] == "inconclusive"
        assert f["reason"].startswith("n/a: ")
