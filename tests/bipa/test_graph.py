"""P2 episode graph on hand-made turns with known read spans: edges, metrics, Parquet, GraphML."""

import json

import pytest

from schemas import ArtifactStore
from tasks.bipa import contracts  # noqa: F401
from tasks.bipa.graph import build_graph, edge_rows, graph_metrics, graphml_text, read_graphml_text


def _sp(source, turn, tokens, sha, **kw):
    return {"source": source, "turn": turn, "tokens": tokens, "sha256": sha, **kw}


def _turn(ep, idx, spans, prompt_len):
    """A turn whose whole prompt has ``prompt_len`` tokens: turn 0 stores it, a later turn (no
    completion here) the tokens it adds to the previous prompt (tasks.rollout.turns)."""
    prev = _LEN.get(ep, 0) if idx else 0
    _LEN[ep] = prompt_len
    return {"episode_id": ep, "turn_idx": idx, "read_spans": json.dumps(spans), "prompt_continues": idx > 0,
            "prompt_added_ids": [1] * (prompt_len - prev), "completion_token_ids": []}


_LEN: dict[str, int] = {}


def _turns():
    return [
        # A: skill in the system prompt from turn 0; a tool output enters at turn 1
        _turn("A", 0, [_sp("system", 0, 10, "S"), _sp("skill", 0, 5, "K"), _sp("instruction", 0, 3, "IA"),
                       _sp("tool_output", 1, 7, "OA", tool="python")], 20),
        _turn("A", 1, [], 30),
        # B: no skill, one turn
        _turn("B", 0, [_sp("system", 0, 10, "S"), _sp("instruction", 0, 3, "IB")], 15),
        # C: the skill is fetched into the context at turn 1 (e.g. a tool that reads it)
        _turn("C", 0, [_sp("system", 0, 10, "S"), _sp("instruction", 0, 3, "IC"), _sp("skill", 1, 5, "K")], 10),
        _turn("C", 1, [], 20),
        _turn("C", 2, [], 30),
    ]


def test_edges_follow_the_context():
    edges = edge_rows(_turns(), "arm")
    assert len(edges) == 7 + 2 + 8
    a1 = {e["source"] for e in edges if e["episode_id"] == "A" and e["turn_idx"] == 1}
    assert a1 == {"system", "skill", "instruction", "tool_output"}
    c0 = {e["source"] for e in edges if e["episode_id"] == "C" and e["turn_idx"] == 0}
    assert c0 == {"system", "instruction"}
    fetched = [(e["episode_id"], e["turn_idx"], e["source"]) for e in edges if e["fetched"] and e["source"] == "skill"]
    assert fetched == [("A", 0, "skill"), ("C", 1, "skill")]
    g = build_graph(edges)
    # the same system text and the same skill text are one node each, shared by the episodes
    spans = [n for n, d in g.nodes(data=True) if d["bipartite"] == 1]
    assert len(spans) == 1 + 1 + 3 + 1  # system, skill, 3 instructions, tool output
    assert g.degree("span:skill:K") == 2 + 2 and g.degree("span:system:S") == 6


def test_metrics_on_known_turns():
    m = graph_metrics(_turns(), "seed", "test")
    assert (m["episodes"], m["turns"]) == (3, 6)
    assert m["episode_skill_coverage"] == pytest.approx(2 / 3)
    assert m["turn_skill_coverage"] == pytest.approx(4 / 6)
    assert m["mean_turns_to_first_skill_read"] == pytest.approx(0.5)  # A: 0, C: 1
    assert m["skill_input_tokens_per_episode"] == pytest.approx((10 + 0 + 10) / 3)
    assert m["input_tokens_per_episode"] == pytest.approx((50 + 15 + 60) / 3)
    assert m["turns_per_episode"] == pytest.approx(2.0)
    no_skill = graph_metrics([t for t in _turns() if t["episode_id"] == "B"], "seed", "test")
    assert no_skill["episode_skill_coverage"] == 0.0 and no_skill["mean_turns_to_first_skill_read"] is None
    with pytest.raises(ValueError, match="no turns"):
        graph_metrics([], "seed", "test")
    with pytest.raises(ValueError, match="read_spans is not JSON"):
        edge_rows([{"episode_id": "X", "turn_idx": 0, "read_spans": "{"}], "a")


def test_parquet_and_graphml_round_trip(tmp_path):
    edges = edge_rows(_turns(), "seed-test")
    store = ArtifactStore(tmp_path)
    ref = store.write("bipa", "bipa_graph_edges", edges)
    assert store.rows(ref) == edges
    m = graph_metrics(_turns(), "seed", "test")
    assert store.rows(store.write("bipa", "bipa_graph_metrics", [m])) == [m]
    g = build_graph(edges)
    back = read_graphml_text(graphml_text(g))
    assert set(back.nodes) == set(g.nodes) and back.number_of_edges() == g.number_of_edges() == len(edges)
    assert back.nodes["span:skill:K"]["source"] == "skill" and back.nodes["span:skill:K"]["tokens"] == 5
    assert back.nodes["turn:seed-test:C:2"]["turn_idx"] == 2
    assert back.edges["turn:seed-test:C:1", "span:skill:K"]["fetched"] is True
    assert back.edges["turn:seed-test:C:2", "span:skill:K"]["fetched"] is False
