"""The TalkMesh protocol with scripted agents: hint source, kept / not-kept revisions, gossip
consensus on each topology, collusion against majority vote and the defended mesh."""

from __future__ import annotations

import pytest

from tasks.talkmesh.topology import build_topology
from tasks.talkmesh.mesh import MeshSettings, Output, Problem, run_mesh, weighted_vote

P = Problem("p0", "What is 2 + 3?")
RIGHT = "5"


def grade(p: Problem, a: str | None) -> bool:
    return a == RIGHT


def head(scores: dict[str, float]):
    """A scripted confidence head: answer -> confidence."""
    def score(items):
        return [scores[a] for _, a in items]
    return score


class ScriptedTalk:
    """Hints repeat the source's answer; a revision adopts the hint's answer (read from the message)."""

    def __init__(self):
        self.hint_calls, self.revise_calls = [], []

    def hints(self, items, seed):
        self.hint_calls.append([o.answer for _, o in items])
        return [Output(f"I think it is {o.answer}.", o.answer) for _, o in items]

    def revise(self, items, seed):
        self.revise_calls.append([(o.answer, h) for _, o, h in items])
        outs = []
        for _, o, h in items:
            a = h.split("The hint's answer: ")[1].split(";")[0]
            outs.append(Output(f"Answer: {a}", a))
        return outs


def props(*answers):
    return [[Output(f"Answer: {a}", a) for a in answers]]


def test_hint_source_revisions_kept_and_consensus():
    talk = ScriptedTalk()
    # agent 2 is the most confident (0.9 for "5"); agents 0, 1 (0.2 for "7") revise to "5" (0.9 > 0.2: kept);
    # agent 3 holds "9" at 0.6 >= threshold 0.5 and does not revise
    res = run_mesh([P], props("7", "7", "5", "9"), head({"7": 0.2, "5": 0.9, "9": 0.6}), talk, grade,
                   MeshSettings(agents=4, threshold=0.5))
    rows = {m["agent"]: m for m in res.messages}
    assert talk.hint_calls == [["5"]]  # one broadcaster in a full mesh
    assert [rows[i]["hint_source"] for i in range(4)] == [2, 2, -1, -1]
    assert [rows[i]["kept"] for i in range(4)] == [True, True, False, False]
    assert [rows[i]["correct_before"] for i in range(4)] == [False, False, True, False]
    assert [rows[i]["correct_after"] for i in range(4)] == [True, True, True, False]
    r = res.results[0]
    # votes after revision: "5" 0.9 * 3 vs "9" 0.6: every agent decides "5" after one gossip step
    assert r["answer"] == "5" and r["correct"] and r["consensus"] and r["consensus_step"] == 1
    assert r["outputs_spent"] == 4 + 1 + 2  # proposals, one hint, two revisions
    assert r["proposal_accuracy"] == 0.25 and r["final_accuracy"] == 0.75
    assert len(res.revisions) == 2 and all(v["revision_correct"] and not v["proposal_correct"] for v in res.revisions)


def test_revision_not_kept_when_it_scores_lower():
    # agent 1 ("8", 0.45) broadcasts; the receivers' revisions answer "1", scoring 0.1 < 0.3: not kept
    class Worse(ScriptedTalk):
        def revise(self, items, seed):
            return [Output("Answer: 1", "1") for _ in items]

    res = run_mesh([P], props("7", "8", "7"), head({"7": 0.3, "8": 0.45, "1": 0.1}), Worse(), grade,
                   MeshSettings(agents=3, threshold=0.5))
    rows = {m["agent"]: m for m in res.messages}
    assert rows[0]["revision_answer"] == "1" and rows[0]["kept"] is False
    assert rows[0]["revision_confidence"] == pytest.approx(0.1)
    assert res.results[0]["answer"] == "7"  # 0.3 + 0.3 beats 0.45


@pytest.mark.parametrize("kind,steps", [("full", 1), ("ring", 3)])
def test_gossip_reaches_the_weighted_vote(kind, steps):
    # 6 agents, no talk (rounds 0): the weighted vote is "5" (0.9 + 0.8) over "7" (0.4 * 3 = 1.2 < 1.7)
    answers = ("5", "7", "7", "7", "5", "3")
    sc = {"5": 0.85, "7": 0.4, "3": 0.1}
    res = run_mesh([P], props(*answers), head(sc), ScriptedTalk(), grade, MeshSettings(agents=6, topology=kind, rounds=0))
    r = res.results[0]
    assert r["answer"] == weighted_vote([(a, sc[a]) for a in answers]) == "5"
    assert r["consensus"] and r["gossip_steps"] == steps  # ring of 6: diameter 3
    assert r["outputs_spent"] == 6


def test_ring_sources_are_local():
    talk = ScriptedTalk()
    sc = {"5": 0.9, "7": 0.2, "8": 0.3}
    # ring 0-1-2-3-4-5-0: agent 0 is the best ("5"); agent 3 hears only 2, 3, 4 -> source 4 ("8");
    # agent 2 hears three 0.2s (1, 2, 3) -> the lowest id, 1
    res = run_mesh([P], props("5", "7", "7", "7", "8", "7"), head(sc), talk, grade,
                   MeshSettings(agents=6, topology="ring"))
    src = {m["agent"]: m["hint_source"] for m in res.messages}
    assert src == {0: -1, 1: 0, 2: 1, 3: 4, 4: -1, 5: 0}  # 0 and 4 are their own sources
    assert talk.hint_calls[0] == ["5", "7", "8"]  # three broadcasters: 0, 1, 4


def test_regular_topology_is_seeded_and_regular():
    g1, g2 = build_topology("regular", 8, 3, seed=4), build_topology("regular", 8, 3, seed=4)
    assert sorted(g1.edges) == sorted(g2.edges) and all(d == 3 for _, d in g1.degree)
    with pytest.raises(ValueError, match="odd"):
        build_topology("regular", 7, 3)
    with pytest.raises(ValueError, match="degree=8"):
        build_topology("regular", 8, 8)


def test_collusion_flips_majority_but_not_the_defended_mesh():
    # 8 agents: 3 honest right ("5", 0.7), 1 honest wrong ("6", 0.2), 4 colluders claiming 1.0 for "4"
    answers = ("5", "5", "5", "6", "x", "x", "x", "x")
    sc = {"5": 0.7, "6": 0.2, "4": 0.05}
    coll = frozenset({4, 5, 6, 7})
    votes = [("4" if i in coll else a, 1.0) for i, a in enumerate(answers)]
    assert weighted_vote(votes) == "4"  # majority vote: 4 poisoned votes beat 3 right ones
    settings = MeshSettings(agents=8, threshold=0.5)
    kw = dict(colluders=coll, poison=lambda p: "4")
    und = run_mesh([P], props(*answers), head(sc), ScriptedTalk(), grade, settings, **kw)
    dfd = run_mesh([P], props(*answers), head(sc), ScriptedTalk(), grade, settings, defended=True, **kw)
    # undefended: agent 3 (0.2 < 0.5) revises to the poisoned "4", which scores 0.05 < 0.2: not kept;
    # but the gossip trusts the claimed 1.0: 4.0 for "4" beats 2.1 for "5"
    assert und.results[0]["answer"] == "4" and not und.results[0]["correct"]
    # defended: the hint is re-scored 0.05 < 0.2 and ignored; gossip re-scores "4" at 0.05 each
    assert dfd.results[0]["answer"] == "5" and dfd.results[0]["correct"]
    m3 = next(m for m in dfd.messages if m["agent"] == 3)
    assert m3["hint_ignored"] and m3["hint_rescored"] == pytest.approx(0.05) and m3["revision"] is None
    assert und.results[0]["outputs_spent"] == 8 + 1 + 1 and dfd.results[0]["outputs_spent"] == 8 + 1
    assert all(m["colluder"] == (m["agent"] in coll) for m in und.messages)


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="agents=1"):
        MeshSettings(agents=1)
    with pytest.raises(ValueError, match="threshold=1.5"):
        MeshSettings(agents=2, threshold=1.5)
    with pytest.raises(ValueError, match=r"proposals must be \[1\]\[3\]"):
        run_mesh([P], props("5", "5"), head({"5": 1.0}), ScriptedTalk(), grade, MeshSettings(agents=3))
    with pytest.raises(ValueError, match="poison"):
        run_mesh([P], props("5", "5"), head({"5": 1.0}), ScriptedTalk(), grade, MeshSettings(agents=2),
                 colluders=frozenset({1}))
