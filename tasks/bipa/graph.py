"""The episode graph of P2 (docs/methods/p2-bipa.md): a bipartite graph G = (turns, read-text spans)
with an edge (t, x) when span x was in, or was fetched into, the context of turn t.

Built from the ``turns`` rows' ``read_spans`` (see :mod:`tasks.rollout.harness`): each span
carries ``source`` (system, skill, demonstration, instruction, file, page, tool_output, format_error), ``turn``
(the first turn whose prompt holds it), ``tokens`` and ``sha256`` of its text. The engine never
rewrites earlier context, so a span that entered at turn k is in the context of every later turn
of its episode: turn t is joined to every span of its episode with ``turn <= t``; the edge is
``fetched`` when ``turn == t`` (the span entered the context at that turn).

Span nodes are identified by content (source, SHA-256, path, tool), so the same skill text read
by many episodes is one node with many edges.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any, Iterable

import networkx as nx

from tasks.rollout.turns import prompt_lengths

SPAN_SOURCES = ("system", "skill", "demonstration", "instruction", "file", "page", "tool_output", "format_error")


def _span_node(s: dict[str, Any]) -> str:
    parts = [s["source"], s.get("sha256", "")]
    if s.get("path"):
        parts.append(f"path={s['path']}")
    if s.get("tool"):
        parts.append(f"tool={s['tool']}")
    return "span:" + ":".join(parts)


def episode_spans(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All read spans of one episode's turn rows, de-duplicated by span node, in order.

    Raises:
        ValueError: a ``read_spans`` value that is not a JSON list, or a span without ``source``
            or ``turn`` (names the episode and turn).
    """
    out: dict[str, dict[str, Any]] = {}
    for t in turns:
        raw = t.get("read_spans") or "[]"
        try:
            spans = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"episode {t['episode_id']} turn {t['turn_idx']}: read_spans is not JSON: {e}") from None
        if not isinstance(spans, list):
            raise ValueError(f"episode {t['episode_id']} turn {t['turn_idx']}: read_spans must be a list, not "
                             f"{type(spans).__name__}")
        for s in spans:
            if "source" not in s or "turn" not in s:
                raise ValueError(f"episode {t['episode_id']} turn {t['turn_idx']}: span {s} lacks source or turn")
            out.setdefault(_span_node(s), s)
    return list(out.values())


def _by_episode(turns: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    eps: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        eps.setdefault(t["episode_id"], []).append(t)
    for rows in eps.values():
        rows.sort(key=lambda r: r["turn_idx"])
    return eps


def edge_rows(turns: Iterable[dict[str, Any]], arm: str) -> list[dict[str, Any]]:
    """The edge list of the episode graph of ``turns`` (rows of the ``turns`` contract; only
    ``episode_id``, ``turn_idx`` and ``read_spans`` are read), labelled ``arm``.

    Returns:
        rows of the ``bipa_graph_edges`` contract, ordered by (episode, turn, span entry order).
        ``turn_node`` is ``turn:<arm>:<episode_id>:<turn_idx>``.
    """
    rows = []
    for ep, ts in _by_episode(turns).items():
        spans = episode_spans(ts)
        for t in ts:
            ti = int(t["turn_idx"])
            tn = f"turn:{arm}:{ep}:{ti}"
            for s in spans:
                if int(s["turn"]) <= ti:
                    rows.append({"arm": arm, "episode_id": ep, "turn_idx": ti, "turn_node": tn,
                                 "span_node": _span_node(s), "source": s["source"], "span_turn": int(s["turn"]),
                                 "tokens": int(s.get("tokens", 0)), "fetched": int(s["turn"]) == ti})
    return rows


def build_graph(edges: list[dict[str, Any]]) -> nx.Graph:
    """A networkx bipartite graph from ``bipa_graph_edges`` rows: turn nodes have ``bipartite=0``
    and attributes arm, episode_id, turn_idx; span nodes ``bipartite=1`` and source, tokens;
    edges carry span_turn and fetched."""
    g = nx.Graph()
    for e in edges:
        g.add_node(e["turn_node"], bipartite=0, kind="turn", arm=e["arm"], episode_id=e["episode_id"],
                   turn_idx=e["turn_idx"])
        g.add_node(e["span_node"], bipartite=1, kind="span", source=e["source"], tokens=e["tokens"])
        g.add_edge(e["turn_node"], e["span_node"], span_turn=e["span_turn"], fetched=e["fetched"])
    return g


def graphml_text(g: nx.Graph) -> str:
    """``g`` as GraphML (UTF-8 text), nodes and edges in insertion order."""
    buf = io.BytesIO()
    nx.write_graphml(g, buf, encoding="utf-8")
    return buf.getvalue().decode("utf-8")


def read_graphml_text(text: str) -> nx.Graph:
    """Parse :func:`graphml_text` output back into a graph."""
    return nx.read_graphml(io.BytesIO(text.encode("utf-8")))


def _mean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def graph_metrics(turns: list[dict[str, Any]], arm: str, score_set: str) -> dict[str, Any]:
    """Episode-graph metrics of one arm's turns (rows with ``episode_id``, ``turn_idx``,
    ``read_spans`` and the prompt columns, :mod:`tasks.rollout.turns`).

    - ``episode_skill_coverage``: fraction of episodes with at least one turn whose context held a
      ``skill`` span; ``turn_skill_coverage``: the same over turns.
    - ``mean_turns_to_first_skill_read``: mean over episodes that read the skill of the index
      (0-based) of the first turn whose context held it (None when none did).
    - ``skill_input_tokens_per_episode``: mean over episodes of the sum over turns of the skill
      spans' tokens in that turn's context (each turn's prompt re-reads the skill).
    - ``input_tokens_per_episode``: mean over episodes of the sum of prompt lengths (tokens);
      ``turns_per_episode``: mean number of turns.

    Raises:
        ValueError: ``turns`` is empty (no episode to measure).
    """
    eps = _by_episode(turns)
    if not eps:
        raise ValueError(f"graph_metrics: arm {arm!r} set {score_set!r} has no turns")
    n_turns, skill_turns, first, skill_tok, in_tok, covered = 0, 0, [], [], [], 0
    for ts in eps.values():
        skills = [s for s in episode_spans(ts) if s["source"] == "skill"]
        ep_first, ep_tok = None, 0
        for t in ts:
            ti = int(t["turn_idx"])
            here = [s for s in skills if int(s["turn"]) <= ti]
            n_turns += 1
            if here:
                skill_turns += 1
                ep_first = ti if ep_first is None else ep_first
                ep_tok += sum(int(s.get("tokens", 0)) for s in here)
        if ep_first is not None:
            covered += 1
            first.append(float(ep_first))
        skill_tok.append(float(ep_tok))
        in_tok.append(float(sum(prompt_lengths(ts))))
    return {"arm": arm, "score_set": score_set, "episodes": len(eps), "turns": n_turns,
            "episode_skill_coverage": covered / len(eps), "turn_skill_coverage": skill_turns / n_turns,
            "mean_turns_to_first_skill_read": _mean(first), "skill_input_tokens_per_episode": _mean(skill_tok),
            "input_tokens_per_episode": _mean(in_tok), "turns_per_episode": n_turns / len(eps)}
