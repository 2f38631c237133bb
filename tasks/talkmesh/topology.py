"""The communication graph of a mesh harness (a ``talkmesh`` loop's ``mesh`` block): who hears whom.

The ``mesh`` section's validation builds the graph once to refuse an impossible ``degree``
(:class:`tasks.talkmesh.harness_block.MeshSpec`, registered with the TalkMesh application); the
mesh (:mod:`tasks.talkmesh.mesh`) builds it for every problem.
"""

from __future__ import annotations

from typing import Literal

import networkx as nx

Topology = Literal["full", "ring", "regular"]


def build_topology(kind: Topology, n: int, degree: int = 2, seed: int = 0) -> nx.Graph:
    """The communication graph on agents 0..n-1.

    ``full``: the complete graph; ``ring``: the cycle (n >= 3; n = 2 is one edge); ``regular``: a
    random ``degree``-regular graph (``networkx.random_regular_graph``, seeded), redrawn with
    seed + 1, + 2, ... until connected (at most 100 draws).

    Raises:
        ValueError: unknown ``kind``; for ``regular``: degree < 1, degree >= n, n * degree odd,
            or no connected draw in 100 tries.
    """
    if kind == "full":
        return nx.complete_graph(n)
    if kind == "ring":
        return nx.cycle_graph(n) if n >= 3 else nx.complete_graph(n)
    if kind == "regular":
        if not 1 <= degree < n:
            raise ValueError(f"topology regular: degree={degree} must be in [1, agents-1={n - 1}]")
        if (n * degree) % 2:
            raise ValueError(f"topology regular: agents * degree = {n}*{degree} is odd; no such regular graph")
        for t in range(100):
            g = nx.random_regular_graph(degree, n, seed=seed + t)
            if nx.is_connected(g):
                return g
        raise ValueError(f"topology regular: no connected {degree}-regular graph on {n} nodes in 100 draws")
    raise ValueError(f"topology={kind!r} is not one of full, ring, regular")
