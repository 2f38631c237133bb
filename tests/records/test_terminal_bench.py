"""Terminal-Bench suite: both task layouts load, oracles score 1.0 and untouched workspaces score
below 1.0 in a bwrap sandbox, the reward is the fraction of checks passed, and bad task folders are
refused with the folder and the field named."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from tasks.config import SuiteConfig
from tasks.records.suites.base import load_suite
from tasks.records.suites.terminal_bench import (
    BUILTIN_DIR, TaskFormatError, run_oracle, run_tests, static_test_count, task_from_folder,
)
from tasks.records.verifiers import VerifierError, grade
from tests.records.tb_helpers import Ctx, new_sandbox, require_sandbox

# Terminal-Bench tasks from outside the builtin suite: two ship with the tests (a tb1 task and an
# Exercism one; provenance and licences in its MANIFEST.tsv); HARNESSRL_TB_DIR points at a larger folder
TB_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "terminal-bench"
SHARED = Path(os.environ.get("HARNESSRL_TB_DIR", str(TB_FIXTURES)))
TB2_BUILTIN = {"checksum-manifest", "join-csv", "jsonl-errors", "split-log-by-date", "users-json-transform"}


def _builtin():
    return load_suite(SuiteConfig(source="terminal_bench", name="builtin", size=1000))


def _shared():
    if not SHARED.is_dir():
        return []
    return load_suite(SuiteConfig(source="terminal_bench", name=str(SHARED), size=1000))


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


TB1_OK = {
    "task.yaml": "instruction: do it\nparser_name: pytest\nmax_test_timeout_sec: 20\n",
    "tests/test_outputs.py": "def test_a():\n    assert open('/app/out.txt').read() == 'ok\\n'\n",
    "solution.sh": "echo ok > /app/out.txt\n",
}


# ---------------------------------------------------------------------------------- loading


def test_builtin_suite_has_both_layouts_sorted_and_capped():
    tasks = _builtin()
    folders = sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(tasks) == len(folders) >= 20
    assert [t.task_id for t in tasks] == [f"builtin/{f}" for f in folders]
    fmt = {t.task_id.split("/")[1]: t.metadata["format"] for t in tasks}
    assert {k for k, v in fmt.items() if v == "tb2"} == TB2_BUILTIN
    assert sum(v == "tb1" for v in fmt.values()) == len(tasks) - len(TB2_BUILTIN)
    for t in tasks:
        assert t.environment == "workspace" and t.suite == "terminal_bench/builtin"
        assert t.workspace["setup"] == [] and t.workspace["files"] and t.instruction.strip()
        assert t.verifier_kind == "terminal_bench" and t.verifier_spec["oracle"]["entry"] in ("solution.sh", "solve.sh")
        assert sum(r["expected"] for r in t.verifier_spec["run"]) >= 3  # several checks: partial credit
        assert t.verifier_spec["timeout_s"] == 30.0 and t.metadata["agent_timeout_s"] == 300.0
    capped = load_suite(SuiteConfig(source="terminal_bench", name="builtin", size=3))
    assert [t.task_id for t in capped] == [t.task_id for t in tasks[:3]]


def test_load_is_deterministic():
    a = [t.task_hash for t in _builtin()]
    b = [t.task_hash for t in _builtin()]
    assert a == b and len(set(a)) == len(a)


def test_shared_tasks_load():
    if not SHARED.is_dir():
        pytest.skip(f"Terminal-Bench folder {SHARED} (HARNESSRL_TB_DIR) not present")
    tasks = _shared()
    assert [t.task_id.split("/")[1] for t in tasks] == sorted(p.name for p in SHARED.iterdir() if p.is_dir())
    assert {t.metadata["format"] for t in tasks} == {"tb1"}
    poly = [t for t in tasks if "polyglot" in t.task_id]
    assert len(poly) >= 1
    for t in poly:  # Exercism tests go next to the module; the encrypted oracle stays hidden
        (run,) = t.verifier_spec["run"]
        assert run["at"] == run["src"] and run["src"].endswith("_test.py")
        assert not any(k.startswith(".oracle") for k in t.workspace["files"])
        assert list(t.verifier_spec["oracle"]["app_files_b64"]) == [".oracle/solution.enc"]
        assert t.verifier_spec["oracle"]["exercism"]["from"] == ".meta/example.py"
    evo = next(t for t in tasks if t.task_id.endswith("/evoeval-1"))
    assert evo.workspace["files"] == {} and evo.verifier_spec["timeout_s"] == 120.0
    assert evo.verifier_spec["run"] == [{"src": "test_outputs.py", "at": None, "expected": 2}]


def test_missing_folder_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=f"suites\\[\\].name='{missing}'.*no such folder"):
        load_suite(SuiteConfig(source="terminal_bench", name=str(missing), size=5))
    with pytest.raises(ValueError, match="holds no task folders"):
        load_suite(SuiteConfig(source="terminal_bench", name=str(tmp_path), size=5))
    with pytest.raises(ValueError, match="params"):
        load_suite(SuiteConfig(source="terminal_bench", name="builtin", size=5, params={"x": 1}))


BAD = [
    ("layout", {"README": "x"}, "layout: neither TB1"),
    ("no-instruction", {**TB1_OK, "task.yaml": "parser_name: pytest\n"}, "task.yaml:instruction: missing"),
    ("parser", {**TB1_OK, "task.yaml": "instruction: x\nparser_name: swebench\n"}, "task.yaml:parser_name: 'swebench'"),
    ("same-shell", {**TB1_OK, "task.yaml": "instruction: x\nrun_tests_in_same_shell: true\n"},
     "task.yaml:run_tests_in_same_shell"),
    ("timeout", {**TB1_OK, "task.yaml": "instruction: x\nmax_test_timeout_sec: -1\n"},
     "task.yaml:max_test_timeout_sec: -1"),
    ("yaml", {**TB1_OK, "task.yaml": "instruction: [x\n"}, "task.yaml: not valid YAML"),
    ("no-tests", {"task.yaml": "instruction: x\n"}, "tests/: missing"),
    ("only-test-sh", {"task.yaml": "instruction: x\n", "tests/test.sh": "pytest /tests\n"},
     "tests/: no pytest files.*test.sh"),
    ("abs-tests", {**TB1_OK, "tests/test_outputs.py": "def test_a():\n    open('/tests/data.txt')\n"},
     "tests/test_outputs.py: refers to the absolute path /tests"),
    ("syntax", {**TB1_OK, "tests/test_outputs.py": "def test_a(:\n"}, "tests/test_outputs.py: not valid Python"),
    ("binary-ws", {**TB1_OK}, "workspace/blob.bin: workspace files must be UTF-8"),
    ("tb2-no-toml", {"instruction.md": "x\n", "tests/test_a.py": "def test_a(): pass\n"}, "task.toml: missing"),
    ("tb2-no-md", {"task.toml": "", "tests/test_a.py": "def test_a(): pass\n"}, "instruction.md: missing"),
    ("tb2-toml", {"instruction.md": "x\n", "task.toml": "[verifier\n"}, "task.toml: not valid TOML"),
    ("tb2-gpu", {"instruction.md": "x\n", "task.toml": "[environment]\ngpus = 1\n", "tests/test_a.py": "def test_a(): pass\n"},
     r"task.toml:\[environment\].gpus: 1"),
    ("tb2-timeout", {"instruction.md": "x\n", "task.toml": "[verifier]\ntimeout_sec = 'soon'\n"},
     r"task.toml:\[verifier\].timeout_sec: 'soon'"),
    ("tb2-steps", {"instruction.md": "x\n", "task.toml": "", "steps/one/instruction.md": "x"}, "steps/: multi-step"),
    ("tb2-compose", {"instruction.md": "x\n", "task.toml": "", "environment/docker-compose.yaml": "services: {}\n",
                     "tests/test_a.py": "def test_a(): pass\n"}, "environment/docker-compose.yaml: multi-container"),
    ("tb2-empty", {"instruction.md": "<!-- canary GUID 1 -->\n\n", "task.toml": ""}, "instruction.md: empty"),
]


@pytest.mark.parametrize("name,files,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_task_folders_are_refused_naming_folder_and_field(tmp_path, name, files, msg):
    folder = _write(tmp_path / "suite" / name, files)
    if name == "binary-ws":
        (folder / "workspace").mkdir()
        (folder / "workspace" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TaskFormatError, match=msg) as e:
        load_suite(SuiteConfig(source="terminal_bench", name=str(tmp_path / "suite"), size=5))
    assert str(folder) in str(e.value)


def test_a_missing_task_folder_is_named_as_missing(tmp_path):
    with pytest.raises(TaskFormatError, match="nope: folder: no such directory"):
        task_from_folder(tmp_path / "nope", "t")


def test_symlink_in_workspace_refused(tmp_path):
    folder = _write(tmp_path / "t", TB1_OK)
    (folder / "workspace").mkdir()
    (folder / "workspace" / "link").symlink_to("/etc/passwd")
    with pytest.raises(TaskFormatError, match="workspace/link: symbolic links"):
        task_from_folder(folder, "x")


def test_static_test_count():
    import ast

    src = textwrap.dedent("""
        import pytest, unittest
        def test_a(): pass
        def helper(): pass
        @pytest.mark.parametrize("x", [1, 2, 3])
        @pytest.mark.parametrize("y", (1, 2))
        def test_b(x, y): pass
        class TestC:
            def test_m(self): pass
            def other(self): pass
        class TestWithInit:
            def __init__(self): pass
            def test_not_collected(self): pass
        class ForthTest(unittest.TestCase):
            def test_u1(self): pass
            def test_u2(self): pass
        """)
    assert static_test_count(ast.parse(src)) == 1 + 6 + 1 + 2
    assert static_test_count(ast.parse("x = 1\n")) == 1


def test_hidden_files_never_in_instruction_or_workspace():
    for t in _builtin() + _shared():
        spec = t.verifier_spec
        visible = [t.instruction, *t.workspace["files"].values()]
        hidden = list(spec["tests"].values()) + [json.dumps(spec["oracle"])]
        for text in hidden:
            for line in text.splitlines():
                if line.strip().startswith(("def test", "assert ", "EXPECTED", "TOP")):
                    assert not any(line.strip() in v for v in visible), (t.task_id, line)
        assert not set(t.workspace["files"]) & {"solution.sh", "solve.sh", "test_outputs.py", "test.sh"}
        assert not any(k.startswith((".oracle/", "tests/", "solution/")) for k in t.workspace["files"])
        assert "Dockerfile" not in t.workspace["files"]


# ---------------------------------------------------------------------------------- grading


def _oracle_cases():
    cases = [pytest.param(t, id=t.task_id) for t in _builtin()]
    cases += [pytest.param(t, id=t.task_id) for t in _shared()]
    return cases


@pytest.mark.parametrize("task", _oracle_cases())
def test_oracle_scores_one_and_untouched_workspace_below_one(task):
    require_sandbox()
    sb = new_sandbox(task.workspace)
    try:
        untouched = grade(task.verifier_kind, task.verifier_spec, None, Ctx(sb))
    finally:
        sb.cleanup()
    sb = new_sandbox(task.workspace)
    try:
        run_oracle(task.verifier_spec, sb)
        solved = grade(task.verifier_kind, json.dumps(task.verifier_spec), None, Ctx(sb))
    finally:
        sb.cleanup()
    assert solved == 1.0
    assert untouched < 1.0


def _mini_task(tmp_path, tests: dict[str, str], toml: str = "[verifier]\ntimeout_sec = 20.0\n",
               env: dict[str, str] | None = None):
    files = {"instruction.md": "Write /app/mod.py.\n", "task.toml": toml, **{f"tests/{k}": v for k, v in tests.items()},
             **{f"environment/{k}": v for k, v in (env or {}).items()}}
    return task_from_folder(_write(tmp_path / "mini", files), "mini")


def test_reward_is_fraction_of_checks_and_import_failure_counts_its_tests(tmp_path):
    require_sandbox()
    task = _mini_task(tmp_path, {
        "test_a.py": """
            import sys
            sys.path.insert(0, "/app")
            import pytest
            from mod import f
            def test_one(): assert f(1) == 2
            def test_two(): assert f(2) == 4
            @pytest.mark.parametrize("x", [3, 4, 5])
            def test_three(x): assert f(x) == 2 * x + 1
            """,
        "test_b.py": """
            import sys
            sys.path.insert(0, "/app")
            from mod import g
            def test_g1(): assert g()
            def test_g2(): assert g()
            def test_g3(): assert g()
            """,
        "helper_data.txt": "not a test\n",
    }, env={"mod.py": "def f(x):\n    return 2 * x\n"})
    assert [r["expected"] for r in task.verifier_spec["run"]] == [5, 3]
    sb = new_sandbox(task.workspace)
    try:
        r = run_tests(task.verifier_spec, sb)
        reward = grade("terminal_bench", task.verifier_spec, None, Ctx(sb))
    finally:
        sb.cleanup()
    # test_a: 2 of 5 pass; test_b fails to import (no g): 0 of its 3 static tests
    assert r["files"] == [{"src": "test_a.py", "passed": 2, "total": 5, "collect_error": False},
                          {"src": "test_b.py", "passed": 0, "total": 3, "collect_error": True}]
    assert reward == pytest.approx(2 / 8)


def test_timeout_scores_zero_within_the_limit(tmp_path):
    require_sandbox()
    task = _mini_task(tmp_path, {"test_a.py": "import time\ndef test_ok(): pass\ndef test_slow(): time.sleep(60)\n"},
                      toml="[verifier]\ntimeout_sec = 3.0\n")
    sb = new_sandbox(task.workspace)
    try:
        t0 = time.monotonic()
        r = run_tests(task.verifier_spec, sb)
        wall = time.monotonic() - t0
    finally:
        sb.cleanup()
    assert r["status"] == "timeout" and r["passed"] == 0 and r["total"] == 2
    assert wall < 10


def test_agent_code_cannot_fake_a_pass(tmp_path):
    """os._exit(0) at import, a conftest.py / pytest.ini in /app, output floods: no free checks."""
    require_sandbox()
    tests = {"test_a.py": """
        import sys
        sys.path.insert(0, "/app")
        def test_good():
            import mod
            assert mod.VALUE == 1
        def test_bad():
            import mod
            assert mod.VALUE == 2
        def test_exit():
            import exiter
        """}
    hack = {
        "mod.py": "print('x' * 100000)\nVALUE = 1\n",
        "exiter.py": "import os\nos._exit(0)\n",
        "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                       "    out = yield\n    out.get_result().outcome = 'passed'\n",
        "pytest.ini": "[pytest]\naddopts = -p no:python\n",
    }
    task = _mini_task(tmp_path, tests, env=hack)
    sb = new_sandbox(task.workspace)
    try:
        died = run_tests(task.verifier_spec, sb)
        sb.write_file("exiter.py", "X = 1\n")
        ok = run_tests(task.verifier_spec, sb)
    finally:
        sb.cleanup()
    assert (died["status"], died["passed"]) == ("died", 0)  # the test process exited early: nothing counts
    assert (ok["status"], ok["passed"], ok["total"]) == ("ok", 2, 3)  # the conftest did not turn test_bad green


def test_exercism_tests_run_next_to_the_module(tmp_path):
    require_sandbox()
    folder = _write(tmp_path / "ex", {
        "task.yaml": "instruction: implement twice in twice.py\n",
        "workspace/twice.py": "def twice(x):\n    pass\n",
        "tests/twice_test.py": """
            import unittest
            from twice import twice
            class TwiceTest(unittest.TestCase):
                def test_zero(self): self.assertEqual(twice(0), 0)
                def test_two(self): self.assertEqual(twice(2), 4)
            """,
        "tests/.meta/config.json": json.dumps({"files": {"solution": ["twice.py"], "test": ["twice_test.py"],
                                                         "example": [".meta/example.py"]}}),
        "tests/.meta/example.py": "def twice(x):\n    return 2 * x\n",
    })
    task = task_from_folder(folder, "ex")
    assert task.verifier_spec["run"] == [{"src": "twice_test.py", "at": "twice_test.py", "expected": 2}]
    assert set(task.workspace["files"]) == {"twice.py"}
    sb = new_sandbox(task.workspace)
    try:
        stub = grade("terminal_bench", task.verifier_spec, None, Ctx(sb))
        run_oracle(task.verifier_spec, sb)
        solved = grade("terminal_bench", task.verifier_spec, None, Ctx(sb))
    finally:
        sb.cleanup()
    assert (stub, solved) == (0.0, 1.0)


def test_verifier_errors():
    task = _builtin()[0]
    with pytest.raises(VerifierError, match="needs the episode's sandbox"):
        grade("terminal_bench", task.verifier_spec, None, None)


def test_pytest_missing_in_sandbox_is_a_verifier_error(monkeypatch):
    require_sandbox()
    import tasks.environments.sandbox.bwrap as bw

    monkeypatch.setattr(bw, "sandbox_site", lambda: None)
    task = _builtin()[0]
    sb = new_sandbox(task.workspace)
    try:
        with pytest.raises(VerifierError, match="pytest is not importable"):
            grade("terminal_bench", task.verifier_spec, None, Ctx(sb))
    finally:
        sb.cleanup()


def test_tb2_verifier_env_and_canary_line(tmp_path):
    require_sandbox()
    files = {"instruction.md": "<!-- BENCHMARK DATA canary GUID 123 -->\n# Task\nSay hi.\n",
             "task.toml": '[verifier]\ntimeout_sec = 20.0\nenv = { GREETING = "hi", N = 3 }\n',
             "tests/test_env.py": "import os\ndef test_env(): assert (os.environ['GREETING'], os.environ['N']) == ('hi', '3')\n"}
    task = task_from_folder(_write(tmp_path / "envtask", files), "x")
    assert task.instruction == "# Task\nSay hi.\n"
    assert task.verifier_spec["env"] == {"GREETING": "hi", "N": "3"}
    sb = new_sandbox(task.workspace)
    try:
        assert grade("terminal_bench", task.verifier_spec, None, Ctx(sb)) == 1.0
    finally:
        sb.cleanup()


def test_oracle_reading_solution_mount_is_refused_clearly(tmp_path):
    files = {"instruction.md": "x\n", "task.toml": "", "tests/test_a.py": "def test_a(): pass\n",
             "solution/solve.sh": "cp /solution/answer.py /app/\n", "solution/answer.py": "x = 1\n"}
    task = task_from_folder(_write(tmp_path / "sol", files), "x")
    assert set(task.verifier_spec["oracle"]["files_b64"]) == {"solve.sh", "answer.py"}
    with pytest.raises(ValueError, match="absolute /solution or /oracle path"):
        run_oracle(task.verifier_spec, sandbox=None)
    with pytest.raises(ValueError, match="no Exercism reference"):
        run_oracle(task.verifier_spec, sandbox=None, method="exercism")
