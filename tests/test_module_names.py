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

# file name -> (the modules allowed to share it, why the package name says it all). An entry or a
# path that no longer exists fails the test below, so the list only shrinks.
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "stage.py": (frozenset({"tasks/records/stage.py", "tasks/rollout/stage.py", "tasks/train/stage.py",
                            "tasks/evaluate/stage.py", "tasks/analysis/stage.py"}),
                 "each stage's door (run_freeze, run_rollout, ...), the one module the flows open"),
    "base.py": (frozenset({"tasks/config/base.py", "tasks/environments/sandbox/base.py",
                           "tasks/records/suites/base.py", "tasks/rollout/engines/base.py"}),
                "the base the package's other modules build on: the strict config model, the sandbox "
                "interface, the suite registry and Task, the engine interface"),
    "report.py": (frozenset({"tasks/analysis/report.py", "tasks/bipa/report.py", "tasks/talkmesh/report.py"}),
                  "the report.md of the pipeline's analysis, of a BiPA run, of a TalkMesh run"),
    "contracts.py": (frozenset({"schemas/contracts.py", "tasks/bipa/contracts.py", "tasks/talkmesh/contracts.py"}),
                     "artifact contracts: the cores' registry, and each application's own, registered into it"),
    "seal.py": (frozenset({"tasks/evaluate/seal.py", "tasks/talkmesh/seal.py"}),
                "the plan hash and hash chain of the sealed evaluation, and the same seal applied to a TalkMesh run"),
    "findings.py": (frozenset({"tasks/evaluate/findings.py", "tasks/talkmesh/findings.py"}),
                    "the pre-registered findings (measure, interval, verdict) of the sealed evaluation, and "
                    "of a TalkMesh run, decided by the evaluation's verdict rule"),
    "config.py": (frozenset({"tasks/bipa/config.py", "tasks/talkmesh/config.py"}),
                  "each application's config section"),
    "miniwob.py": (frozenset({"tasks/environments/browser/miniwob.py", "tasks/records/suites/miniwob.py"}),
                   "MiniWoB++ in each of its roles: the browser session, and the suite that freezes its tasks"),
    "run.py": (frozenset({"tasks/config/run.py", "tasks/talkmesh/run.py"}),
               "tasks/config names each module for what it configures (run.py: the whole run); "
               "tasks/talkmesh/run.py runs the application (its entry point's name is issue 54's apps branch's)"),
}


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
        allowed = ALLOWED.get(name, (frozenset(), ""))[0]
        if len(group) > 1 and not set(group) <= allowed:
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
    assert sorted(p for paths, _ in ALLOWED.values() for p in paths if not (ROOT / p).is_file()) == []


def test_the_check_catches_a_shared_name():
    paths = ["tasks/rollout/policy.py", "tasks/config/policy.py", "tasks/records/stage.py", "tasks/train/stage.py",
             "tasks/newstage/stage.py", "flows/server.py", "tasks/environments/sandbox/server.py", "tasks/hashing.py"]
    assert clashes(paths) == {
        "policy.py": ["tasks/config/policy.py", "tasks/rollout/policy.py"],
        "server.py": ["flows/server.py", "tasks/environments/sandbox/server.py"],
        "stage.py": ["tasks/newstage/stage.py", "tasks/records/stage.py", "tasks/train/stage.py"],
    }
    assert clashes(["tasks/records/stage.py", "tasks/train/stage.py"]) == {}
