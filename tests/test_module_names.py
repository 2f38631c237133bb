"""No two modules of the package share a file name unless they do the same job for the package that
holds them (the package name then says whose it is): ``tasks/talkmesh/report.py`` and
``tasks/bipa/report.py`` each write their application's report, while a ``findings.py`` that
computes the verdicts and one that copies rows into a results file would make a reader open the
wrong one.

Scanned: the importable modules (every folder a package) of ``tasks``, ``schemas`` and ``flows``,
``__init__.py`` left out. Not scanned: ``tests/`` and ``benchmarks/``, which name a file after
what it tests or measures on purpose, and the task suites' workspace files (data for the graders,
not modules).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("tasks", "schemas", "flows")

# file name -> the folders whose module of that name may share it, each with why the package name
# says it all (in the comment above it). A folder without that module fails the test below, so
# the list only shrinks.
ALLOWED: dict[str, str] = {
    # each stage's door (run_freeze, run_rollout, ...), the one module the flows open
    "stage.py": "tasks/records tasks/rollout tasks/train tasks/evaluate tasks/analysis",
    # the base the package's other modules build on: the strict config model, the sandbox
    # interface, the suite registry and Task, the engine interface
    "base.py": "tasks/config tasks/environments/sandbox tasks/records/suites tasks/rollout/engines",
    # the report.md of the pipeline's analysis, of a BiPA run, of a TalkMesh run
    "report.py": "tasks/analysis tasks/bipa tasks/talkmesh",
    # artifact contracts: the cores' registry, and each application's own, registered into it
    "contracts.py": "schemas tasks/bipa tasks/talkmesh",
    # the sealed evaluation's plan hash and hash chain, and the same seal applied to a TalkMesh run
    "seal.py": "tasks/evaluate tasks/talkmesh",
    # the pre-registered findings (measure, interval, verdict) of the sealed evaluation, and of a
    # TalkMesh run, decided by the evaluation's verdict rule
    "findings.py": "tasks/evaluate tasks/talkmesh",
    # each application's config section
    "config.py": "tasks/bipa tasks/talkmesh",
    # MiniWoB++ in each of its roles: the browser session, and the suite that freezes its tasks
    "miniwob.py": "tasks/environments/browser tasks/records/suites",
    # each application's registration (tasks/<application>/application.py), and in flows/, whose
    # modules are the flows, the flow that runs an application
    "application.py": "tasks/bipa tasks/talkmesh flows",
    # the application registry (tasks/registries holds the registries), and the one list of the
    # modules that register into it
    "applications.py": "tasks/registries tasks",
    # each application's hooks into harnessrl verify and harnessrl findings (owns_run, verify, findings)
    "publish.py": "tasks/bipa tasks/talkmesh",
    # tasks/config names each module for what it configures (run.py: the whole run);
    # tasks/talkmesh/run.py runs the application (its entry point's name is the apps branch's)
    "run.py": "tasks/config tasks/talkmesh",
}


def allowed_paths(name: str) -> set[str]:
    """The module paths :data:`ALLOWED` lets share the file ``name`` (``stage.py`` ->
    ``{"tasks/records/stage.py", ...}``); empty for a name it does not list."""
    return {f"{folder}/{name}" for folder in ALLOWED.get(name, "").split()}


def _is_module(rel: PurePosixPath) -> bool:
    """Whether ``rel`` (a .py path relative to the root) is importable: each folder below the
    scanned top a package."""
    return all((ROOT.joinpath(*rel.parts[:i]) / "__init__.py").is_file() for i in range(1, len(rel.parts)))


def modules() -> list[str]:
    """Every scanned module's path relative to the root (``tasks/rollout/harness.py``), sorted."""
    out = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            rel = PurePosixPath(path.relative_to(ROOT).as_posix())
            if rel.name != "__init__.py" and _is_module(rel):
                out.append(str(rel))
    return sorted(out)


def clashes(paths: list[str]) -> dict[str, list[str]]:
    """File name -> the sorted paths that share it, for each name held by two or more ``paths``
    where some of them are not allowed by :data:`ALLOWED`."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        by_name[PurePosixPath(p).name].append(p)
    out = {}
    for name, group in by_name.items():
        if len(group) > 1 and not set(group) <= allowed_paths(name):
            out[name] = sorted(group)
    return out


def test_the_scan_sees_the_package():
    found = modules()
    assert {"tasks/rollout/harness.py", "tasks/environments/sandbox/bwrap.py", "schemas/contracts.py",
            "flows/pipeline.py", "tasks/hashing.py"} <= set(found)
    assert not any("/suites/terminal/" in p for p in found)  # the Terminal-Bench task data


def test_no_two_modules_share_a_file_name_for_different_jobs():
    assert clashes(modules()) == {}


def test_every_allowed_module_still_exists():
    assert sorted(p for name in ALLOWED for p in allowed_paths(name) if not (ROOT / p).is_file()) == []


def test_the_check_catches_a_shared_name():
    # made-up paths under a folder the repository does not have (pkg/), beside two real stages
    paths = ["pkg/rollout/policy.py", "pkg/config/policy.py", "tasks/records/stage.py", "tasks/train/stage.py",
             "pkg/newstage/stage.py", "pkg/flows/server.py", "pkg/sandbox/server.py", "tasks/hashing.py"]
    assert clashes(paths) == {
        "policy.py": ["pkg/config/policy.py", "pkg/rollout/policy.py"],
        "server.py": ["pkg/flows/server.py", "pkg/sandbox/server.py"],
        "stage.py": ["pkg/newstage/stage.py", "tasks/records/stage.py", "tasks/train/stage.py"],
    }
    assert clashes(["tasks/records/stage.py", "tasks/train/stage.py"]) == {}
