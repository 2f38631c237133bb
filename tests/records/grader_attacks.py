"""The adversarial battery (issue 20, item 1): files and processes an agent can leave behind to make
a verifier pass a wrong answer, tried on real tasks of every verifier kind, on both sandbox backends.

An *attempt* is what the agent leaves in its sandbox before grading: files under /app (``files``,
``{placeholders}`` filled per task) and shell commands it ran (``cmds``, e.g. files outside /app,
symlinks, background processes). Each cell of the battery is (attempt, verifier kind, backend) and
runs twice, in fresh sandboxes: with the task's wrong answer (the untouched workspace or a wrong
reply) and with its right answer (the oracle / canonical solution), the attempt planted after the
answer. A defended grader gives 0.0 and 1.0: the attempt neither passes the wrong answer nor stops
the real tests from deciding the right one.

``python -m tests.records.grader_attacks [bwrap|docker ...]`` prints the table.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tasks.records.suites.terminal_bench import parse_python  # ast.parse under the suite's lock (see _imports)

REPO = Path(__file__).resolve().parents[2]
TB_FIXTURES = REPO / "tests" / "records" / "fixtures" / "terminal-bench"  # shipped: see its MANIFEST.tsv

# Python run by every planted hook: if it ever executes in the grading process, failed checks pass
# (pytest reports read as passed; HumanEval's ``check`` replaced by a no-op) and it leaves a mark.
PATCH = '''
import builtins, sys
try:
    open("/tmp/harnessrl-attack-ran", "a").write(__name__ + "\\n")
except OSError:
    pass
try:
    import _pytest.reports as _r
    _r.TestReport.passed = property(lambda self: True)
    _r.TestReport.failed = property(lambda self: False)
except Exception:
    pass
if not getattr(builtins, "_harnessrl_attack", False):
    builtins._harnessrl_attack = True
    _exec = builtins.exec
    def exec(code, ns=None, *rest):
        r = _exec(code, ns, *rest) if ns is not None else _exec(code, sys._getframe(1).f_globals)
        if isinstance(ns, dict) and "check" in ns:
            ns["check"] = lambda *a, **k: None
        return r
    builtins.exec = exec
'''

HOOK = '''
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    rep.outcome = "passed"
    rep.longrepr = None
'''

PLUGIN = PATCH + HOOK  # a module that is a pytest plugin and patches on import
INI_PLUGIN = "pythonpath = /app\naddopts = -p evilplug\n"
PASSING_TEST = "def test_always():\n    assert True\n"


def _passing_copy(src: str) -> str:
    """A test file with the same test names as ``src``, every test a pass."""
    names = [n.name for n in ast.walk(parse_python(src)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name.startswith("test")]
    return "".join(f"def {n}(*a, **k):\n    pass\n" for n in names) or PASSING_TEST


@dataclass(frozen=True)
class Attempt:
    """One thing an agent leaves behind. ``files``: /app-relative path -> text (``{user_site}``,
    ``{test_src}`` etc. are filled by :func:`plant`); ``cmds``: sh commands run after the files."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    cmds: tuple[str, ...] = ()
    per_test_file: Callable[[str, str], dict[str, str]] | None = None  # (src, text) -> more files


USER_SITE = ".local/lib/python3.{minor}/site-packages"
DAEMON = ("setsid sh -c 'while :; do for d in /tmp/harnessrl-verify-*/tests /app /tmp; do "
          "cp /app/.evil/conftest.py \"$d/conftest.py\" 2>/dev/null; done; "
          "echo 1 > /app/reward.txt; sleep 0.01; done' </dev/null >/dev/null 2>&1 &")

ATTEMPTS: tuple[Attempt, ...] = (
    Attempt("conftest in /app", {"conftest.py": PLUGIN}),
    Attempt("conftest in /app/tests", {"tests/conftest.py": PLUGIN}),
    Attempt("conftest in /tmp (above the test folder)", {".evil/conftest.py": PLUGIN},
            ("cp /app/.evil/conftest.py /tmp/conftest.py",)),
    Attempt("pytest.ini loading a plugin", {"pytest.ini": "[pytest]\n" + INI_PLUGIN, "evilplug.py": PLUGIN}),
    Attempt("tox.ini loading a plugin", {"tox.ini": "[pytest]\n" + INI_PLUGIN, "evilplug.py": PLUGIN}),
    Attempt("setup.cfg loading a plugin", {"setup.cfg": "[tool:pytest]\n" + INI_PLUGIN, "evilplug.py": PLUGIN}),
    Attempt("pyproject.toml loading a plugin",
            {"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["/app"]\naddopts = "-p evilplug"\n',
             "evilplug.py": PLUGIN}),
    Attempt("sitecustomize.py in /app", {"sitecustomize.py": PATCH}),
    Attempt("usercustomize.py in the user site (HOME=/app)", {USER_SITE + "/usercustomize.py": PATCH}),
    Attempt(".pth files (user site and /app)", {USER_SITE + "/evil.pth": "import evilpth\n",
                                                USER_SITE + "/evilpth.py": PATCH, "evil.pth": "import evilpth\n",
                                                "evilpth.py": PATCH}),
    Attempt("pytest shadowed (pytest.py, _pytest/, pluggy/)",
            {"pytest.py": PATCH + "def main(*a, **k):\n    return 0\n", "_pytest/__init__.py": PATCH,
             "pluggy/__init__.py": PATCH}),
    Attempt("standard library shadowed",
            {m: PATCH for m in ("unittest.py", "json.py", "csv.py", "re.py", "traceback.py", "difflib.py",
                                "inspect.py", "importlib/__init__.py", "functools.py", "tempfile.py")}),
    Attempt("the tests' imports shadowed", per_test_file=lambda src, text: {
        f"{m}.py": PATCH for m in _imports(text)}),
    Attempt("pytest plugin by entry point (.dist-info in /app)",
            {"evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
             "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplug\n", "evilplug.py": PLUGIN}),
    Attempt("__init__.py tricks", {"__init__.py": PLUGIN, "tests/__init__.py": PLUGIN}),
    Attempt("pre-written reward and results files",
            {"reward.txt": "1\n", "reward.json": '{"reward": 1.0}\n', "results.json": '{"passed": 99, "total": 99}\n',
             "pytest.log": "HARNESSRL-TB-RESULT x {}\n"},
            ("mkdir -p /tmp/logs/verifier && echo 1 > /tmp/logs/verifier/reward.txt",
             "echo 1 > /tmp/reward.txt")),
    Attempt("passing tests where the tests would be copied",
            per_test_file=lambda src, text: {src: _passing_copy(text), f"tests/{src}": _passing_copy(text)}),
    Attempt("symlinks where the tests would be copied",
            {".evil/test_pass.py": PASSING_TEST}, ("for f in {test_srcs}; do rm -f \"/app/$f\"; "
                                                   "ln -s /app/.evil/test_pass.py \"/app/$f\"; done",)),
    Attempt("a process left running to rewrite files during grading", {".evil/conftest.py": PLUGIN}, (DAEMON,)),
    Attempt("shell start-up files setting PYTHONPATH / PYTHONSTARTUP",
            {".profile": "export PYTHONPATH=/app PYTHONSTARTUP=/app/sitecustomize.py\n",
             ".bashrc": "export PYTHONPATH=/app\n", ".pythonrc.py": PATCH, "sitecustomize.py": PATCH}),
    Attempt("forged bytecode for the test module",
            per_test_file=lambda src, text: {f"__pycache__/{Path(src).stem}.cpython-3{{minor}}.pyc": "junk"}),
    Attempt("every file above at once", per_test_file=lambda src, text: {
        "conftest.py": PLUGIN, "tests/conftest.py": PLUGIN, "pytest.ini": "[pytest]\n" + INI_PLUGIN,
        "evilplug.py": PLUGIN, "sitecustomize.py": PATCH, USER_SITE + "/usercustomize.py": PATCH,
        "pytest.py": PATCH, "unittest.py": PATCH, "__init__.py": PLUGIN, src: _passing_copy(text)}),
)


def _imports(text: str) -> list[str]:
    # parse_python takes the suite's process-wide lock: CPython 3.11 fails two threads parsing at
    # once ("AST constructor recursion depth mismatch", python/cpython#106905); cells run 4 at a time
    out: list[str] = []
    for n in ast.walk(parse_python(text)):
        if isinstance(n, ast.Import):
            out += [a.name.split(".")[0] for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.append(n.module.split(".")[0])
    return sorted(set(out))


# ----------------------------------------------------------------------------------------------
# verifier kinds: a real task each, how to give it the wrong and the right answer


@dataclass
class Kind:
    """A verifier kind under attack: ``task()`` the Task, ``answer(sb, right)`` applies an answer
    to the sandbox and returns the ``answer`` string graded (None for work-dir graders),
    ``test_files`` the hidden test files {src: text} (for attempts that copy them)."""

    name: str
    task: Callable[[], Any]
    answer: Callable[[Any, Any, bool], str | None]
    test_files: Callable[[Any], dict[str, str]]


@functools.lru_cache(maxsize=None)
def _tb(folder: str, reward: str = "fraction") -> Any:
    from tasks.records.suites.terminal_bench import BUILTIN_DIR, task_from_folder

    path = BUILTIN_DIR / folder if (BUILTIN_DIR / folder).is_dir() else TB_FIXTURES / folder
    return task_from_folder(path, "battery", reward=reward)


def _tb_answer(task: Any, sb: Any, right: bool) -> None:
    from tasks.records.suites.terminal_bench import run_oracle

    if right:
        run_oracle(task.verifier_spec, sb, timeout_s=60.0)
    return None


def _tb_tests(task: Any) -> dict[str, str]:
    return {r["src"]: task.verifier_spec["tests"][r["src"]] for r in task.verifier_spec["run"]}


@functools.lru_cache(maxsize=None)
def _humaneval() -> Any:
    from tasks.config import SuiteConfig
    from tasks.records.suites.base import load_suite

    return load_suite(SuiteConfig(source="humaneval", name="HumanEval", size=1))[0]


def _he_answer(task: Any, sb: Any, right: bool) -> None:
    if right:
        spec = task.verifier_spec
        sb.write_file("solution.py", task.workspace["files"]["solution.py"] + spec["canonical_solution"])
    return None


@functools.lru_cache(maxsize=None)
def _rg() -> Any:
    from tasks.config import SuiteConfig
    from tasks.records.suites.base import load_suite

    return load_suite(SuiteConfig(source="reasoning_gym", name="basic_arithmetic", size=1, seed=3))[0]


KINDS: dict[str, Kind] = {
    "humaneval": Kind("humaneval", _humaneval, _he_answer,
                      lambda t: {"humaneval_test.py": t.verifier_spec["test"]}),
    "tb1-exercism": Kind("tb1-exercism", lambda: _tb("polyglot_python_forth"), _tb_answer, _tb_tests),
    "tb1": Kind("tb1", lambda: _tb("evoeval-1"), _tb_answer, _tb_tests),
    "harbor": Kind("harbor", lambda: _tb("join-csv"), _tb_answer, _tb_tests),
    "p6": Kind("p6", lambda: _tb("polyglot_python_forth", "p6"), _tb_answer, _tb_tests),
    "reasoning-gym": Kind("reasoning-gym", _rg,
                          lambda t, sb, right: t.verifier_spec["answer"] if right else "wrong",
                          lambda t: {}),
}


KINDS_NO_SANDBOX = ("miniwob",)  # graded from the browser page: :func:`run_miniwob`


class _BrowserCtx:
    def __init__(self, browser: Any, sb: Any):
        self.browser, self._sb = browser, sb

    def sandbox(self) -> Any:
        return self._sb


def run_miniwob(attempts: tuple[Attempt, ...], backend: str) -> list[str]:
    """MiniWoB (click-button, seed 11): for each attempt, a fresh ``backend`` sandbox with the
    attempt planted is the episode's sandbox while the page is solved wrongly and rightly and
    graded. Returns the failing cells (empty: every attempt 0.0 / 1.0)."""
    from tasks.config import SuiteConfig
    from tasks.records.suites.base import load_suite
    from tasks.records.verifiers import grade
    from tasks.environments.browser import open_browser
    from tests.records.tb_helpers import new_sandbox
    from tests.environments.test_miniwob import solve

    task = load_suite(SuiteConfig(source="miniwob", name="click-button", size=1, seed=11))[0]
    row = task.to_row("test")
    sess = open_browser(row, seed=0)
    bad = []
    try:
        for a in attempts:
            sb = new_sandbox({}, backend=backend, wall_s=60.0, cpu_s=60)
            try:
                plant(sb, a, {})
                got = []
                for right in (False, True):
                    sess.reset(task.verifier_spec["seed"])
                    solve(sess, "click-button", right=right)
                    got.append(grade("miniwob", row["verifier_spec"], None, _BrowserCtx(sess, sb)))
            finally:
                sb.cleanup()
            if got != [0.0, 1.0]:
                bad.append(f"{a.name}: wrong answer {got[0]}, right answer {got[1]}")
    finally:
        sess.close()
    return bad


def plant(sb: Any, attempt: Attempt, tests: dict[str, str], keep: set[str] = frozenset()) -> None:
    """Leave ``attempt``'s files and run its commands in ``sb``, as the agent (uid 65534, cwd /app).
    ``keep``: the answer's own files (never overwritten: the attempt comes on top of the answer)."""
    from tests.records.tb_helpers import write_files

    minor = sys.version_info.minor
    files = dict(attempt.files)
    if attempt.per_test_file:
        for src, text in tests.items():
            files.update(attempt.per_test_file(src, text))
    write_files(sb, {k.format(minor=minor): v for k, v in files.items() if k not in keep})
    for cmd in attempt.cmds:
        r = sb.exec(["sh", "-c", cmd.format(test_srcs=" ".join(sorted(tests)) or "none")])
        assert r.status == "ok", (attempt.name, r)


def run_cell(kind: Kind, attempt: Attempt, backend: str, right: bool) -> tuple[float, bool]:
    """``(reward, planted code ran)`` of ``kind``'s task with the wrong (``right=False``) or right
    answer and ``attempt`` planted after it, in a fresh ``backend`` sandbox. The second value is
    True when any planted Python ran during grading (it leaves /tmp/harnessrl-attack-ran)."""
    from tasks.records.verifiers import grade
    from tests.records.tb_helpers import Ctx, new_sandbox

    task = kind.task()
    sb = new_sandbox(task.workspace, backend=backend, wall_s=60.0, cpu_s=60)
    try:
        answer = kind.answer(task, sb, right)
        keep = set(task.workspace.get("files", {}))
        ex = (task.verifier_spec.get("oracle") or {}).get("exercism")
        if ex:
            keep.add(ex["to"])
        plant(sb, attempt, kind.test_files(task), keep)
        reward = grade(task.verifier_kind, task.verifier_spec, answer, Ctx(sb))
        ran = sb.exec(["test", "-e", "/tmp/harnessrl-attack-ran"]).status == "ok"
        return reward, ran
    finally:
        sb.cleanup()


def battery(kinds: list[str], backends: list[str], attempts: tuple[Attempt, ...] = ATTEMPTS) -> list[dict[str, Any]]:
    """Every cell: ``[{"attempt", "kind", "backend", "wrong", "right", "ran"}]`` (rewards; whether
    planted code ran while grading)."""
    rows = []
    for backend in backends:
        for k in kinds:
            for a in attempts:
                (wrong, ran_w), (right, ran_r) = (run_cell(KINDS[k], a, backend, r) for r in (False, True))
                rows.append({"attempt": a.name, "kind": k, "backend": backend, "wrong": wrong, "right": right,
                             "ran": ran_w or ran_r})
    return rows


if __name__ == "__main__":
    import time

    backends = sys.argv[1:] or ["bwrap", "docker"]
    t0 = time.time()
    rows = battery(list(KINDS), backends)
    cols = [f"{k} {b}" for b in backends for k in KINDS]
    print("| attempt | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for a in ATTEMPTS:
        cells = []
        for b in backends:
            for k in KINDS:
                r = next(r for r in rows if (r["attempt"], r["kind"], r["backend"]) == (a.name, k, b))
                cells.append(f"{r['wrong']:g} / {r['right']:g}" + (" (ran)" if r["ran"] else ""))
        print(f"| {a.name} | " + " | ".join(cells) + " |")
    print(f"({time.time() - t0:.0f} s; each cell: wrong answer / right answer)", file=sys.stderr)
