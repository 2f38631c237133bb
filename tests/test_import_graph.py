"""The package's import graph, every import counted (module level and inside functions), built by
grimp: no cycles, the cores never import an application, no import runs back up the layers, and a
stage's module (``tasks/<stage>/stage.py``) is a door that only the flows, the benchmarks and the
tests open.

The layers, lowest first (a module may import its own layer and those below it):

| rank | packages |
| --- | --- |
| 0 | ``schemas``, the helpers at the top of ``tasks`` (``tasks.hashing``, ``tasks.progress``, ``tasks.yamlfile``, ``tasks.command``), the registries of what people add (``tasks.registries``), the import list of the applications (``tasks.applications``, which names their modules as strings) and the environments' exceptions (``tasks.environments.errors``) |
| 1 | ``tasks.harnesses`` |
| 2 | ``tasks.config`` |
| 3 | ``tasks.environments`` (the sandbox and the browser) |
| 4 | ``tasks.records`` |
| 5 | ``tasks.rollout`` |
| 6 | ``tasks.train`` |
| 7 | ``tasks.evaluate`` |
| 8 | ``tasks.analysis`` |
| 9 | the applications: ``tasks.talkmesh``, ``tasks.bipa`` |
| 10 | ``flows`` |

The sandbox and the browser sit below both stages that use them: the verifiers (``tasks.records``)
grade inside them, and the episode loop (``tasks.rollout``) opens them and grades with the
verifiers. Their exceptions (``tasks.environments.errors``, a module that imports nothing) sit at
rank 0, because the harness tools (rank 1) raise ``SandboxPathError``; the rest of the sandbox
reads its limits from the configuration (rank 2). The applications plug into the cores through
:mod:`tasks.registries.applications` (which imports the modules that :mod:`tasks.applications` lists, by
name), :mod:`tasks.rollout.loop_plugins` and the contract registry instead of being imported by them.
"""

from __future__ import annotations

import grimp
import networkx as nx
import pytest

CORES = ("tasks.environments", "tasks.records", "tasks.rollout", "tasks.train", "tasks.evaluate", "tasks.analysis",
         "tasks.harnesses", "tasks.config", "schemas")
APPLICATIONS = ("tasks.talkmesh", "tasks.bipa")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("schemas", "tasks.hashing", "tasks.progress", "tasks.yamlfile", "tasks.command", "tasks.registries",
     "tasks.applications", "tasks.environments.errors"),
    ("tasks.harnesses",),
    ("tasks.config",),
    ("tasks.environments",),
    ("tasks.records",),
    ("tasks.rollout",),
    ("tasks.train",),
    ("tasks.evaluate",),
    ("tasks.analysis",),
    APPLICATIONS,
    ("flows",),
)
# Imports allowed to run up, by name (none: the freeze stage's pre-registration of the evaluation
# is written by the flow, flows.stages.freeze_and_preregister, above both layers).
UPWARD_ALLOWED: set[tuple[str, str]] = set()
# Who may open a stage's door.
STAGE_OPENERS = ("flows", "benchmarks", "tests")


def _build(*packages: str) -> nx.DiGraph:
    g = grimp.build_graph(*packages, cache_dir=None)
    out = nx.DiGraph()
    for m in g.modules:
        out.add_node(m)
        for d in g.find_modules_directly_imported_by(m):
            out.add_edge(m, d)
    return out


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return _build("tasks", "schemas", "flows", "benchmarks", "tests")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def rank(module: str) -> int | None:
    """The layer of ``module`` (an index into LAYERS), None for a module outside them (tests,
    benchmarks, the ``tasks`` package's own ``__init__``)."""
    for i, layer in enumerate(LAYERS):
        if _under(module, layer):
            return i
    return None


def upward_imports(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges (importer, imported) from a layer to a higher one, less UPWARD_ALLOWED."""
    bad = []
    for a, b in graph.edges:
        ra, rb = rank(a), rank(b)
        if ra is not None and rb is not None and rb > ra and (a, b) not in UPWARD_ALLOWED:
            bad.append((a, b))
    return sorted(bad)


def stage_openers(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges (importer, stage module) whose importer is not a flow, a benchmark or a test."""
    return sorted((a, b) for a, b in graph.edges
                  if b.startswith("tasks.") and b.endswith(".stage") and not _under(a, STAGE_OPENERS))


def test_the_graph_is_the_package(graph):
    """Guards the tests below against an empty or partial graph."""
    assert {"tasks.rollout.stage", "tasks.rollout.runner", "tasks.train.trainer", "tasks.talkmesh.episodes",
            "flows.pipeline", "schemas", "benchmarks.rollout", "tests.test_import_graph"} <= set(graph.nodes)
    assert graph.has_edge("tasks.rollout.runner", "tasks.rollout.loop_plugins")
    assert graph.has_edge("tasks.train.stage", "tasks.train.loops")  # an import inside a function counts
    assert graph.has_edge("flows.stages", "tasks.rollout.stage")
    # every package of tasks and the top-level helpers sit in a layer
    tops = {".".join(m.split(".")[:2]) for m in graph.nodes if m.startswith("tasks.")}
    assert sorted(t for t in tops if rank(t) is None) == []


def test_no_import_cycles(graph):
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_the_cores_import_no_application(graph):
    bad = sorted((a, b) for a, b in graph.edges if _under(a, CORES) and _under(b, APPLICATIONS))
    assert bad == []


def test_no_import_runs_up_the_layers(graph):
    assert upward_imports(graph) == []


def test_only_flows_benchmarks_and_tests_open_a_stage(graph):
    assert stage_openers(graph) == []


def test_the_checks_catch_a_forbidden_import(graph):
    """Each rule above fails on the import it forbids (a core importing an application, a lower
    layer importing a higher one, a package opening another's stage)."""
    g = graph.copy()
    g.add_edge("tasks.harnesses.spec", "tasks.talkmesh.mesh")
    g.add_edge("tasks.config.run", "tasks.rollout.models")
    g.add_edge("tasks.evaluate.exports", "tasks.train.stage")
    g.add_edge("tasks.environments.browser", "tasks.records.suites.base")  # the loop the shared rank hid
    g.add_edge("tasks.records.verifiers", "tasks.rollout.harness")
    g.add_edge("tasks.environments.errors", "tasks.environments.sandbox.base")
    assert upward_imports(g) == [("tasks.config.run", "tasks.rollout.models"),
                                 ("tasks.environments.browser", "tasks.records.suites.base"),
                                 ("tasks.environments.errors", "tasks.environments.sandbox.base"),
                                 ("tasks.harnesses.spec", "tasks.talkmesh.mesh"),
                                 ("tasks.records.verifiers", "tasks.rollout.harness")]
    assert stage_openers(g) == [("tasks.evaluate.exports", "tasks.train.stage")]
    assert rank("tasks.environments.errors") == 0 and rank("tasks.environments.sandbox.bwrap") == 3
    assert rank("tasks.records.suites.base") == 4 and rank("tasks.rollout.harness") == 5
    assert rank("tasks.talkmesh.run") == 9 and rank("flows.cli") == 10 and rank("tests.conftest") is None
