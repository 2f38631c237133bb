"""ECE on hand examples, the confidence head's fit, the vote curves, the talk GRPO batch."""

from __future__ import annotations

import pytest
import torch

from tasks.talkmesh.baselines import vote_curves
from tasks.talkmesh.calibration import expected_calibration_error, fit_head
from tasks.talkmesh.mesh import Output, Problem
from tasks.talkmesh.talk import revision_reward, talk_sequences
from tasks.harnesses.spec import SamplingSpec


def test_ece_hand_example():
    # bins of width 0.5: [0, 0.5) holds 0.1, 0.3 (acc 0.5, conf 0.2); [0.5, 1] holds 0.8, 1.0 (acc 1, conf 0.9)
    # ECE = 0.5 * |0.5 - 0.2| + 0.5 * |1.0 - 0.9| = 0.15 + 0.05 = 0.2
    assert expected_calibration_error([0.1, 0.3, 0.8, 1.0], [0, 1, 1, 1], bins=2) == pytest.approx(0.2)
    assert expected_calibration_error([0.75] * 4, [1, 1, 1, 0], bins=10) == pytest.approx(0.0)
    assert expected_calibration_error([1.0, 0.0], [0, 1], bins=10) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="outside"):
        expected_calibration_error([1.2], [1])


def test_head_fits_a_separable_feature_and_is_calibrated_on_the_base_rate():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=g)
    y = [bool(v > 0) for v in x[:, 2]]
    head = fit_head(x, y, l2=1e-3, steps=50)
    p = head.predict(x)
    assert sum((c > 0.5) == t for c, t in zip(p, y)) / 200 > 0.97
    # an uninformative feature: the head predicts the base rate (0.25) everywhere
    const = torch.ones(8, 3)
    h2 = fit_head(const, [1, 0, 0, 0, 1, 0, 0, 0], steps=20)
    assert h2.predict(const) == pytest.approx([0.25] * 8, abs=1e-4)
    with pytest.raises(ValueError, match="labels"):
        fit_head(const, [2] * 8)


def test_vote_curves_by_hand():
    # one problem, samples in order: 3, 5, 5, 7 ; right answer 5
    answers = [["3", "5", "5", "7"]]
    conf = [[0.9, 0.2, 0.2, 0.1]]
    ok = [{"3": False, "5": True, "7": False}]
    rows = {(r["method"], r["k"]): r["accuracy"] for r in vote_curves(answers, conf, ok, k_max=4)}
    # majority: k=1 "3"; k=2 tie 3/5 -> first seen "3"; k=3 "5"; k=4 "5"
    assert [rows[("majority", k)] for k in (1, 2, 3, 4)] == [0.0, 0.0, 1.0, 1.0]
    # weighted: "3" 0.9 beats "5" 0.4 at every k
    assert [rows[("confidence_weighted", k)] for k in (1, 2, 3, 4)] == [0.0] * 4
    # averaged over orderings: k = 4 uses every sample in any order -> still 1.0
    again = vote_curves(answers, conf, ok, k_max=4, resamples=8, seed=3)
    assert [r["accuracy"] for r in again if r["method"] == "majority"][3] == 1.0
    with pytest.raises(ValueError, match="k_max=5"):
        vote_curves(answers, conf, ok, k_max=5)


def test_talk_sequences_rewards_and_groups():
    p = Problem("p", "q")
    hint = Output("hint", "5", (1, 2), (3, 4), (-0.5, -0.25))
    rev_ok = Output("Answer: 5", "5", (1, 2, 3), (9, 10, 0), (-0.1, -0.2, -0.3))
    rev_bad = Output("Answer: 6", "6", (1, 2, 3), (11,), (-0.4,))
    revs = [{"problem": p, "hint": hint, "revision": rev_ok, "proposal_correct": False, "revision_correct": True},
            {"problem": p, "hint": hint, "revision": rev_bad, "proposal_correct": True, "revision_correct": False},
            {"problem": p, "hint": Output("The answer is 4.", "4"), "revision": rev_bad, "proposal_correct": False,
             "revision_correct": False}]
    seqs, rows = talk_sequences(revs, SamplingSpec(temperature=0.7))
    assert [s.reward for s in seqs] == [1.0, -1.0, 0.0, 0.0]  # 3 revisions, then the one model-written hint
    assert seqs[0].ids == [1, 2, 3, 9, 10, 0] and seqs[0].mask == [0, 0, 0, 1, 1, 1]
    assert seqs[0].behaviour_logp == [0.0, 0.0, 0.0, -0.1, -0.2, -0.3]
    assert seqs[3].harness_id == "talkmesh-hint" and seqs[3].ids == [1, 2, 3, 4]
    assert {r["group"] for r in rows} == {"p|revision", "p|hint"}
    assert revision_reward(False, True) == 1.0 and revision_reward(True, True) == 0.0
