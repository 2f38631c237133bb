"""The package's import graph, every import counted (module level and inside functions), built by
grimp: no cycles, and the cores never import an application.

The cores are the stages' packages (records, rollout, train, evaluate) and ``schemas``; the
applications (TalkMesh, BiPA) plug into them through :mod:`tasks.rollout.loop_plugins` and the
contract registry instead.
"""

from __future__ import annotations

import grimp
import networkx as nx
import pytest

CORES = ("tasks.records", "tasks.rollout", "tasks.train", "tasks.evaluate", "schemas")
APPLICATIONS = ("tasks.talkmesh", "tasks.bipa")


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    g = grimp.build_graph("tasks", "schemas", "flows", cache_dir=None)
    out = nx.DiGraph()
    for m in g.modules:
        out.add_node(m)
        for d in g.find_modules_directly_imported_by(m):
            out.add_edge(m, d)
    return out


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_graph_is_the_package(graph):
    """Guards the two tests below against an empty or partial graph."""
    assert {"tasks.rollout.stage", "tasks.train.trainer", "tasks.talkmesh.episodes", "flows.pipeline",
            "schemas"} <= set(graph.nodes)
    assert graph.has_edge("tasks.rollout.stage", "tasks.rollout.loop_plugins")
    assert graph.has_edge("tasks.train.stage", "tasks.train.loops")  # an import inside a function counts


def test_no_import_cycles(graph):
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_the_cores_import_no_application(graph):
    bad = sorted((a, b) for a, b in graph.edges if _under(a, CORES) and _under(b, APPLICATIONS))
    assert bad == []
