"""No code outside a package uses its private names (a leading underscore): what another package
needs has a public name in a named module.

A *package* here is ``tasks.<name>`` (with its subpackages), a helper module at the top of
``tasks`` (``tasks.hashing``), or a top-level folder (``schemas``, ``flows``, ``benchmarks``,
``scripts``). Read with ``ast`` from the source, every import counted (module level and inside
functions): ``from X import _y``, ``from X._y import z``, and ``m._y`` where ``m`` names a module
or an object imported from another package. Tests may reach into what they test and are not
scanned.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("tasks", "schemas", "flows", "benchmarks", "scripts")
OURS = ("tasks", "schemas", "flows", "benchmarks", "scripts")

# (importer, module, name) allowed, each with its reason. An entry that no longer matches fails the
# test below, so the list only shrinks.
ALLOWED: set[tuple[str, str, str]] = set()


def package_of(module: str) -> str:
    """``tasks.environments.sandbox.bwrap`` -> ``tasks.environments``; ``tasks.hashing`` -> ``tasks.hashing``;
    ``flows.cli`` -> ``flows``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "tasks" and len(parts) > 1 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_uses(module: str, source: str) -> list[tuple[str, str, str]]:
    """``(importer, module, private name)`` for each use by ``module`` (its ``source``) of a private
    name of another package of ours."""
    tree = ast.parse(source)
    mine = package_of(module)
    out: list[tuple[str, str, str]] = []
    bound: dict[str, str] = {}  # local name -> the dotted object of ours it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in OURS:
            src = node.module
            if package_of(src) != mine:
                out += [(module, src, part) for part in src.split(".") if _private(part)]
                out += [(module, src, a.name) for a in node.names if _private(a.name)]
            for a in node.names:
                bound[a.asname or a.name] = f"{src}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = bound.get(ast.unparse(node.value))
            if target is not None and package_of(target) != mine:
                out.append((module, target, node.attr))
    return out


def _is_module(path: Path) -> bool:
    """Whether ``path`` is importable code: each folder below the scanned root a package (so the
    task suites' workspace files, data to the graders, are left out)."""
    rel = path.relative_to(ROOT)
    return all((ROOT.joinpath(*rel.parts[:i]) / "__init__.py").is_file() for i in range(2, len(rel.parts)))


def violations() -> list[tuple[str, str, str]]:
    """Every ``(importer, module, private name)`` use in the scanned code, sorted."""
    found = set()
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if _is_module(path):
                found.update(private_uses(_module_name(path), path.read_text()))
    return sorted(found)


def test_no_package_uses_another_packages_private_names():
    assert sorted(set(violations()) - ALLOWED) == []


def test_every_allowed_use_still_exists():
    assert sorted(ALLOWED - set(violations())) == []


def test_the_check_catches_each_form():
    src = ("from tasks.evaluate.stats import _per_task, mean\n"
           "import tasks.progress as P\n"
           "from tasks.config import base\n"
           "from tasks.rollout._hidden import thing\n"
           "from tasks.analysis.report import _own\n"
           "def f():\n"
           "    from flows.status import _names\n"
           "    return P._log, base._Strict, mean._x, P.public\n")
    assert sorted(private_uses("tasks.analysis.ceiling", src)) == [
        ("tasks.analysis.ceiling", "flows.status", "_names"),
        ("tasks.analysis.ceiling", "tasks.config.base", "_Strict"),
        ("tasks.analysis.ceiling", "tasks.evaluate.stats", "_per_task"),
        ("tasks.analysis.ceiling", "tasks.evaluate.stats.mean", "_x"),
        ("tasks.analysis.ceiling", "tasks.progress", "_log"),
        ("tasks.analysis.ceiling", "tasks.rollout._hidden", "_hidden"),
    ]
    assert package_of("tasks.environments.sandbox.bwrap") == "tasks.environments" and package_of("tasks.hashing") == \
        "tasks.hashing" and package_of("benchmarks.learning") == "benchmarks"
