"""No core package and nothing in ``flows/`` names an application: the cores, the stages and the
command line reach TalkMesh, BiPA and the next one only through the application registry
(:mod:`tasks.registries.applications`), whose import list is :mod:`tasks.applications`, the one
place that names them.

The rule, read with ``ast`` from the source of every module under ``tasks/{config, harnesses,
records, rollout, train, evaluate, analysis, registries}``, the helpers at the top of ``tasks``
and ``flows/``: a module *names an application* when it imports one of its modules (``import
tasks.talkmesh...``, ``from tasks.bipa import ...``, ``from tasks import talkmesh``), or when code
spells an application's name (any case) in an identifier (a variable, attribute, function,
class, argument or keyword name) or a string literal, docstrings excepted. Comments and docstrings
are prose: they may cite an application as an example; code may not depend on one by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasks.applications import APPLICATION_MODULES

ROOT = Path(__file__).resolve().parent.parent
CORE_DIRS = ("tasks/config", "tasks/harnesses", "tasks/records", "tasks/rollout", "tasks/train", "tasks/evaluate",
             "tasks/analysis", "tasks/registries", "flows")
# the one registration point: the import list of the applications
REGISTRATION_POINT = "tasks/applications.py"


def application_names() -> tuple[str, ...]:
    """The applications' package names, from the import list (``tasks.talkmesh.application`` ->
    ``talkmesh``)."""
    return tuple(sorted({m.split(".")[1] for m in APPLICATION_MODULES}))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def namings(source: str, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, what)`` for each place ``source`` names an application of ``names`` (module
    docstring's rule)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out: list[tuple[int, str]] = []

    def hit(text: str) -> bool:
        low = text.lower()
        return any(n in low for n in names)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name.split(".")[:2] in [["tasks", n] for n in names]]
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] in [["tasks", n] for n in names] or \
                    (parts == ["tasks"] and any(a.name in names for a in node.names)):
                out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and hit(node.value):
            out.append((node.lineno, f"string {node.value[:60]!r}"))
        elif isinstance(node, ast.Name) and hit(node.id):
            out.append((node.lineno, f"name {node.id}"))
        elif isinstance(node, ast.Attribute) and hit(node.attr):
            out.append((node.lineno, f"attribute .{node.attr}"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and hit(node.name):
            out.append((node.lineno, f"def {node.name}"))
        elif isinstance(node, ast.arg) and hit(node.arg):
            out.append((node.lineno, f"argument {node.arg}"))
        elif isinstance(node, ast.keyword) and node.arg and hit(node.arg):
            out.append((node.lineno, f"keyword {node.arg}="))
        elif isinstance(node, ast.alias) and hit(node.asname or ""):
            out.append((node.lineno, f"as {node.asname}"))
    return sorted(set(out))


def core_files() -> list[Path]:
    files = [p for d in CORE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    files += [p for p in sorted((ROOT / "tasks").glob("*.py")) if p.relative_to(ROOT).as_posix() != REGISTRATION_POINT]
    # task suites' workspace files are data for the graders, not code of ours
    return [p for p in files if all((q / "__init__.py").is_file() for q in p.parents
                                    if ROOT / "tasks" in q.parents or q == ROOT / "tasks" or q == ROOT / "flows")]


def test_the_rule_sees_the_applications_and_the_cores():
    assert application_names() == ("bipa", "talkmesh")
    rel = {p.relative_to(ROOT).as_posix() for p in core_files()}
    assert {"flows/cli.py", "tasks/harnesses/spec.py", "tasks/analysis/stage.py", "tasks/evaluate/verify.py",
            "tasks/registries/applications.py", "tasks/hashing.py"} <= rel
    assert REGISTRATION_POINT not in rel and not any(r.startswith(("tasks/talkmesh/", "tasks/bipa/")) for r in rel)


def test_no_core_module_names_an_application():
    names = application_names()
    bad = {p.relative_to(ROOT).as_posix(): found for p in core_files() if (found := namings(p.read_text(), names))}
    assert bad == {}


@pytest.mark.parametrize("code, what", [
    ("from tasks.talkmesh.seal import PLAN\n", "from tasks.talkmesh.seal import ..."),
    ("import tasks.bipa.optimizer\n", "import tasks.bipa.optimizer"),
    ("from tasks import talkmesh\n", "from tasks import ..."),
    ("x = spec.loop_type != 'talkmesh'\n", "string 'talkmesh'"),
    ("def f():\n    run_bipa()\n", "name run_bipa"),
    ("y = cfg.talkmesh.agents\n", "attribute .talkmesh"),
    ("def talkmesh_section(): pass\n", "def talkmesh_section"),
    ("def f(talkmesh=False): pass\n", "argument talkmesh"),
    ("f(talkmesh=True)\n", "keyword talkmesh="),
    ("PLAN = 'TalkMesh/plan.json'\n", "string 'TalkMesh/plan.json'"),
])
def test_the_rule_catches_each_way_of_naming_one(code, what):
    assert [w for _, w in namings(code, ("bipa", "talkmesh"))] == [what]


def test_prose_is_not_code():
    src = '"""TalkMesh (P3) plugs in here."""\n# talkmesh: a comment\ndef f():\n    """e.g. bipa"""\n    return 1\n'
    assert namings(src, ("bipa", "talkmesh")) == []
