"""Terminal-Bench tasks (instruction, set-up, hidden pytest tests), graded in the episode's sandbox.

``suites[].source: terminal_bench``; ``suites[].name`` is a folder of task folders (one task per
sub-folder, sorted by name) or ``builtin`` for ours in ``tasks/records/suites/terminal/``;
``size`` caps the count (the first ``size`` task folders by name). Two on-disk layouts are read:

TB1 (Terminal-Bench 1, ``terminal-bench`` repo)::

    task.yaml       instruction, parser_name, max_agent_timeout_sec, max_test_timeout_sec,
                    run_tests_in_same_shell, difficulty, category, tags, ... (metadata)
    tests/          pytest files (test_*.py / *_test.py) and anything they read
    solution.sh     the reference solution (oracle), run with bash in /app
    workspace/      optional: the files of /app (Dockerfile ``COPY workspace/ ./``)
    Dockerfile, docker-compose.yaml, run-tests.sh   ignored (no images are pulled; see below)

TB2 / Harbor (Terminal-Bench 2)::

    instruction.md  the instruction (leading canary comment lines are dropped)
    task.toml       [metadata] ..., [verifier] timeout_sec, env; [agent] timeout_sec;
                    [environment] cpus, memory_mb, gpus, allow_internet, docker_image, ...;
                    [solution] env
    tests/          test.sh (ignored) and the pytest files it runs
    solution/       solve.sh (the oracle) and the files it uses
    environment/    Dockerfile (ignored) and the files of its build context, copied to /app

What the agent sees (``Task.instruction`` and ``Task.workspace``): the instruction and the
workspace files (TB1 ``workspace/``, TB2 ``environment/`` minus ``Dockerfile`` and
``docker-compose.y*ml``). Neither layout has set-up commands outside its Dockerfile, and the
Dockerfile is not run, so ``workspace["setup"]`` is always empty. Hidden (``verifier_spec`` only):
every file under ``tests/``, the solution, and TB1's ``workspace/.oracle/`` (the polyglot
adapter's encrypted reference solution).

Grading (verifier ``terminal_bench``), after the agent has finished, in its sandbox: one command
``python3 -s -P -`` whose program arrives on stdin (so nothing hidden touches the work dir before
it runs) writes the test files into a fresh ``mkdtemp`` folder under /tmp and runs pytest
in-process on them there, with a collecting plugin; it prints one result line marked with a random
per-grading token. The reward is the
fraction of checks passed: ``sum(passed) / sum(total)`` over the test files, where a test passes
when its setup, call and teardown all pass (skipped and xfailed tests count as not passed), and a
file's ``total`` is ``max(collected tests, static count)`` (the static count, from the file's
syntax tree, is what a file that fails to import counts as: 0 passed out of it). A test run that
exceeds the task's test timeout, or whose process dies (the agent's code calling ``os._exit``,
a resource limit), scores 0 passed -- Terminal-Bench likewise fails a trial whose tests time out.
:class:`~tasks.records.verifiers.VerifierError` is raised when the verifier itself cannot run
(no sandbox, pytest missing in the sandbox, the sandbox failing, pytest's usage/internal error).
What the agent leaves behind does not steer the run (the battery in
``tests/records/test_grader_battery.py`` plants 22 such attempts against real tasks of both layouts
and the ``p6`` rule, on both backends: a wrong answer scores 0, a right one 1, and no planted Python
runs): the test files run from the private folder, never from /app, so no ``conftest.py``,
``__init__.py`` or ini file of the agent's is on their folder path (``--confcutdir`` is that
folder; ``-c`` names an empty ini, so ``pytest.ini``/``tox.ini``/``setup.cfg``/``pyproject.toml``
are never read); ``-s -P`` keep /app and the user site (HOME is /app) off ``sys.path`` at start-up,
so ``sitecustomize``/``usercustomize``/``.pth`` files and modules named like pytest or the standard
library are not imported; pre-written result files are never read; every process the agent started
was killed when its command ended. Known limit (as in Terminal-Bench, where tests run in the agent's
container): the module under test runs in the test process, so code in the agent's own answer
written to patch the runner at import could change what it reports; an early ``os._exit`` or a
flood of output does not.

Reward rule ``suites[].reward: p6`` (P6: docs/methods/p6-gspo-lora.md; the default ``fraction`` is the rule above):
the spec also carries ``fail_to_pass`` and ``pass_to_pass`` test ids and the reward is passed
fail-to-pass / their count, forced to 0 when a pass-to-pass test does not pass
(:func:`~tasks.records.verifiers.p6_reward`). The lists are a property of the task (hidden tests
and untouched workspace), so they are computed once and frozen with it, not at every grading:
:func:`compute_test_lists` runs the hidden tests in fresh sandboxes (never the agent's) on the
untouched workspace and after the oracle. ``builtin``: ``generate.py`` does that and writes
:data:`LISTS_FILE` into each task folder (reviewed in git, no sandbox needed at freeze); another
folder: its task folders' own :data:`LISTS_FILE` when present, else computed at load (freeze) in
a bwrap sandbox (:data:`LISTS_SANDBOX`). A :data:`LISTS_FILE` is keyed by a hash of the tests,
oracle and workspace (:func:`lists_key`); a stale one is refused. Computing them at grading time
instead would double the grading cost and leave them out of the frozen record (a verifier returns
only a reward).

Exercism tasks (the aider-polyglot adapter: ``tests/.meta/config.json`` with ``files.test``):
their tests import the module from the folder they would be copied to (``/app/<path>``'s folder,
``run[].at``; the task's run-tests.sh copies them there). They are not copied: that folder is
appended to the END of ``sys.path`` once pytest has loaded its plugins (its session start), so the
module under test is found while no file in /app shadows pytest, a plugin (a ``.dist-info`` entry
point), the standard library or another import of the tests.

Refused, with a :class:`TaskFormatError` naming the task folder and the field: a folder that is
neither layout; a missing or empty instruction; ``parser_name`` other than ``pytest``;
``run_tests_in_same_shell: true`` (needs the agent's live shell); non-positive timeouts; TB2
multi-step tasks (``steps/``), ``environment/docker-compose.yaml`` (several containers) and
``[environment] gpus > 0``; a ``tests/`` without pytest files (``test.sh``-only verifiers install
their tools over the network); a test file that is not valid Python or refers to the absolute
paths ``/tests`` / ``$TEST_DIR`` (tests live in a temporary folder here); a workspace file that is
not UTF-8 text, is a symbolic link, or a workspace over ``MAX_WORKSPACE_BYTES``.
Not supported but not refused (documented limits): Dockerfile ``RUN`` steps (packages the image
would install are not there: the sandbox has the host's /usr), ``solution.yaml`` oracles, and
solution scripts that read ``/solution``/``/oracle`` paths.
"""

from __future__ import annotations

import ast
import base64
import json
import re
import secrets
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import yaml

from tasks.config import SuiteConfig
from tasks.hashing import jsonable
from tasks.records.suites.base import Task, register_loader
from tasks.records.verifiers import REWARD_RULES, GradeContext, VerifierError, p6_reward, register_verifier

if TYPE_CHECKING:
    from tasks.environments.sandbox import Sandbox

SOURCE = "terminal_bench"
VERIFIER_KIND = "terminal_bench"
BUILTIN = "builtin"
BUILTIN_DIR = Path(__file__).resolve().parent / "terminal"
MAX_WORKSPACE_BYTES = 2_000_000  # bytes of workspace text per task
TB1_DEFAULT_TEST_TIMEOUT_S = 60.0  # terminal-bench's Task.max_test_timeout_sec default
TB1_DEFAULT_AGENT_TIMEOUT_S = 360.0  # terminal-bench's Task.max_agent_timeout_sec default
TB2_DEFAULT_TIMEOUT_S = 600.0  # harbor's VerifierConfig / AgentConfig timeout_sec default
RESULT_MARK = "HARNESSRL-TB-RESULT"
READY_MARK = "HARNESSRL-TB-READY"

_DOCKER_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml"}
_ABS_TESTS_RE = re.compile(r"(?<![\w.~/-])/tests\b|\$\{?TEST_DIR\b")
_ABS_SOLUTION_RE = re.compile(r"(?<![\w.~/-])/(solution|oracle)\b")
# CPython 3.11's AST converter keeps its recursion depth in interpreter-wide state: two threads
# parsing at once fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI,
# grading four sandboxes at a time). Tasks are loaded from threads (graders, the battery), so
# every parse here takes this lock.
_AST_LOCK = threading.Lock()


def parse_python(src: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(src, filename)` under a process-wide lock (see `_AST_LOCK`; python/cpython#106905).
    Any code that parses Python from threads while tasks load (e.g. the grader battery's attack
    helpers) parses through this function.

    Raises:
        SyntaxError: `src` is not valid Python.
    """
    with _AST_LOCK:
        return ast.parse(src, filename=filename)


class TaskFormatError(ValueError):
    """A task folder that cannot be loaded; the message names the folder and the field."""


@dataclass(frozen=True)
class _Parsed:
    fmt: str
    instruction: str
    workspace: dict[str, str]
    tests: dict[str, bytes]  # path relative to tests/ -> bytes
    run: list[dict[str, Any]]  # {"src": rel path in tests/, "at": None | /app-relative path, "expected": int}
    oracle: dict[str, Any] | None
    timeout_s: float
    env: dict[str, str]
    metadata: dict[str, Any]


# ----------------------------------------------------------------------------------------------
# loader


@register_loader(SOURCE)
def load(cfg: SuiteConfig) -> Iterator[Task]:
    """Yield the first ``cfg.size`` tasks (by folder name) of the task folder ``cfg.name``.

    ``cfg.name``: ``builtin`` (this package's ``terminal/``) or a folder path whose sub-folders are
    task folders (hidden sub-folders are skipped; files such as ``MANIFEST.tsv`` are ignored).
    ``cfg.params`` must be empty; ``cfg.seed`` is unused (nothing is random).

    Raises:
        ValueError: the folder does not exist or holds no task folder; non-empty ``params``.
        TaskFormatError: a task folder (among the first ``size``) that breaks the format.
    """
    if cfg.params:
        raise ValueError(f"suites[].params={cfg.params!r}: source terminal_bench takes no params")
    root = BUILTIN_DIR if cfg.name == BUILTIN else Path(cfg.name).expanduser()
    if not root.is_dir():
        raise ValueError(f"suites[].name={cfg.name!r}: no such folder of Terminal-Bench tasks ({root})")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ValueError(f"suites[].name={cfg.name!r}: folder {root} holds no task folders")
    tag = BUILTIN if cfg.name == BUILTIN else root.resolve().name
    for folder in folders[: cfg.size]:
        yield task_from_folder(folder, tag, reward=cfg.reward)


def task_from_folder(folder: Path, suite_tag: str, reward: str = "fraction") -> Task:
    """One :class:`Task` from a TB1 or TB2 task folder (see the module docstring).

    ``task_id`` = ``<suite_tag>/<folder name>``, ``suite`` = ``terminal_bench/<suite_tag>``.
    ``verifier_spec``: ``format`` (tb1|tb2), ``task`` (folder name), ``timeout_s`` (test wall
    seconds), ``env`` (TB2 ``[verifier].env``), ``tests`` / ``tests_b64`` (every file of ``tests/``,
    text or base64), ``run`` (``[{"src": path in tests/, "at": None or the /app-relative path an
    Exercism test would be copied to (its folder is where the module is imported from), "expected": static test count}]``) and ``oracle`` (None or
    ``{"entry", "files_b64", "app_files_b64", "env"}`` plus ``"exercism": {"from", "to"}``).
    With ``reward="p6"`` the spec also has ``reward: "p6"``, ``fail_to_pass``, ``pass_to_pass``
    (test ids, see :func:`compute_test_lists`) and ``lists_oracle_checked`` (bool): read from the folder's
    :data:`LISTS_FILE` when it has one, else computed now by :func:`compute_test_lists` in a bwrap sandbox
    (:data:`LISTS_SANDBOX`); with ``"fraction"`` (the default) none of these keys is there.

    Raises:
        TaskFormatError: the folder breaks the format (the message names the folder and field);
            its :data:`LISTS_FILE` is malformed or stale; under ``p6``, no test to grade by.
        ValueError: ``reward`` not in ``("fraction", "p6")``.
    """
    if reward not in REWARD_RULES:
        raise ValueError(f"suites[].reward={reward!r}: expected one of {REWARD_RULES}")
    p = _parse(folder)
    tests_text: dict[str, str] = {}
    tests_b64: dict[str, str] = {}
    for rel, data in sorted(p.tests.items()):
        try:
            tests_text[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            tests_b64[rel] = base64.b64encode(data).decode("ascii")
    spec = {
        "format": p.fmt, "task": folder.name, "timeout_s": p.timeout_s, "env": p.env,
        "tests": tests_text, "tests_b64": tests_b64, "run": p.run, "oracle": p.oracle,
    }
    if reward == "p6":
        spec.update(reward="p6", **_lists_for(folder, spec, p.workspace))
    return Task(
        task_id=f"{suite_tag}/{folder.name}",
        suite=f"{SOURCE}/{suite_tag}",
        instruction=p.instruction,
        verifier_kind=VERIFIER_KIND,
        verifier_spec=spec,
        metadata=p.metadata,
        environment="workspace",
        workspace={"files": p.workspace, "setup": []},
    )


def _err(folder: Path, field: str, msg: str) -> TaskFormatError:
    return TaskFormatError(f"terminal-bench task {folder}: {field}: {msg}")


def _parse(folder: Path) -> _Parsed:
    if not folder.is_dir():
        raise _err(folder, "folder", "no such directory")
    if (folder / "task.yaml").is_file():
        return _parse_tb1(folder)
    if (folder / "task.toml").is_file() or (folder / "instruction.md").is_file():
        return _parse_tb2(folder)
    raise _err(folder, "layout", "neither TB1 (task.yaml) nor TB2/Harbor (instruction.md + task.toml)")


def _timeout(folder: Path, field: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _err(folder, field, f"{value!r} is not a positive number of seconds")
    return float(value)


def _parse_tb1(folder: Path) -> _Parsed:
    try:
        cfg = yaml.safe_load((folder / "task.yaml").read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise _err(folder, "task.yaml", f"not valid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise _err(folder, "task.yaml", f"top level is {type(cfg).__name__}, expected a mapping")
    instruction = cfg.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise _err(folder, "task.yaml:instruction", "missing or empty")
    parser = cfg.get("parser_name", "pytest")
    if parser != "pytest":
        raise _err(folder, "task.yaml:parser_name", f"{parser!r} is not supported (only 'pytest')")
    if cfg.get("run_tests_in_same_shell", False) is True:
        raise _err(folder, "task.yaml:run_tests_in_same_shell",
                   "true is not supported: the tests would need the agent's live shell session")
    test_timeout = _timeout(folder, "task.yaml:max_test_timeout_sec", cfg.get("max_test_timeout_sec"),
                            TB1_DEFAULT_TEST_TIMEOUT_S)
    agent_timeout = _timeout(folder, "task.yaml:max_agent_timeout_sec", cfg.get("max_agent_timeout_sec"),
                             TB1_DEFAULT_AGENT_TIMEOUT_S)
    ws_dir = folder / "workspace"
    workspace = _read_workspace(folder, ws_dir, exclude_top={".oracle"}) if ws_dir.is_dir() else {}
    tests, run = _read_tests(folder)
    oracle = None
    if (folder / "solution.sh").is_file():
        files = {"solution.sh": (folder / "solution.sh").read_bytes()}
        oracle_dir = ws_dir / ".oracle"
        app_files = _read_tree(folder, oracle_dir, ".oracle") if oracle_dir.is_dir() else {}
        oracle = _oracle_spec("solution.sh", files, app_files, {})
    oracle = _with_exercism(folder, oracle)
    meta = {k: cfg[k] for k in ("difficulty", "category", "tags", "author_name") if k in cfg}
    meta.update(format="tb1", task_folder=folder.name, agent_timeout_s=agent_timeout, test_timeout_s=test_timeout,
                dockerfile_ignored=(folder / "Dockerfile").is_file())
    return _Parsed("tb1", instruction, workspace, tests, run, oracle, test_timeout, {}, jsonable(meta))


def _strip_canary(text: str) -> str:
    lines = text.splitlines(keepends=True)
    while lines and "canary" in lines[0].lower() and lines[0].lstrip().startswith(("#", "<!--")):
        lines.pop(0)
    return "".join(lines).strip("\n") + "\n"


def _env_table(folder: Path, field: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                              and not isinstance(v, bool) for k, v in value.items()):
        raise _err(folder, field, f"{value!r} is not a table of string values")
    return {k: str(v) for k, v in sorted(value.items())}


def _parse_tb2(folder: Path) -> _Parsed:
    if not (folder / "instruction.md").is_file():
        raise _err(folder, "instruction.md", "missing (a TB2/Harbor task needs instruction.md and task.toml)")
    if not (folder / "task.toml").is_file():
        raise _err(folder, "task.toml", "missing (a TB2/Harbor task needs instruction.md and task.toml)")
    if (folder / "steps").is_dir():
        raise _err(folder, "steps/", "multi-step tasks are not supported")
    try:
        cfg = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _err(folder, "task.toml", f"not valid TOML: {e}") from None
    instruction = _strip_canary((folder / "instruction.md").read_text(encoding="utf-8"))
    if not instruction.strip():
        raise _err(folder, "instruction.md", "empty")
    sections = {}
    for name in ("metadata", "verifier", "agent", "environment", "solution", "task"):
        sec = cfg.get(name, {})
        if not isinstance(sec, dict):
            raise _err(folder, f"task.toml:[{name}]", f"{sec!r} is not a table")
        sections[name] = sec
    ver, agent, env_sec = sections["verifier"], sections["agent"], sections["environment"]
    timeout = _timeout(folder, "task.toml:[verifier].timeout_sec", ver.get("timeout_sec"), TB2_DEFAULT_TIMEOUT_S)
    agent_timeout = _timeout(folder, "task.toml:[agent].timeout_sec", agent.get("timeout_sec"), TB2_DEFAULT_TIMEOUT_S)
    gpus = env_sec.get("gpus", 0)
    if gpus not in (0, None):
        raise _err(folder, "task.toml:[environment].gpus", f"{gpus!r}: tasks that need a GPU are not supported")
    env = _env_table(folder, "task.toml:[verifier].env", ver.get("env"))
    solution_env = _env_table(folder, "task.toml:[solution].env", sections["solution"].get("env"))
    env_dir = folder / "environment"
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (env_dir / name).is_file():
            raise _err(folder, f"environment/{name}", "multi-container tasks are not supported")
    workspace = _read_workspace(folder, env_dir, exclude_top=_DOCKER_FILES) if env_dir.is_dir() else {}
    tests, run = _read_tests(folder)
    sol_dir = folder / "solution"
    oracle = None
    if (sol_dir / "solve.sh").is_file():
        oracle = _oracle_spec("solve.sh", _read_tree(folder, sol_dir, ""), {}, solution_env)
    oracle = _with_exercism(folder, oracle)
    meta = dict(sections["metadata"])
    if sections["task"]:
        meta["task"] = sections["task"]
    meta.update(format="tb2", task_folder=folder.name, agent_timeout_s=agent_timeout, test_timeout_s=timeout,
                dockerfile_ignored=(env_dir / "Dockerfile").is_file(),
                allow_internet=bool(env_sec.get("allow_internet", True)))
    return _Parsed("tb2", instruction, workspace, tests, run, oracle, timeout, env, jsonable(meta))


def _read_tree(folder: Path, base: Path, prefix: str) -> dict[str, bytes]:
    """Every regular file under ``base`` as ``{prefix/relative path: bytes}``, sorted."""
    out: dict[str, bytes] = {}
    for f in sorted(base.rglob("*")):
        rel = f.relative_to(base).as_posix()
        field = f"{base.relative_to(folder).as_posix()}/{rel}"
        if f.is_symlink():
            raise _err(folder, field, "symbolic links are not supported")
        if f.is_file():
            out[f"{prefix}/{rel}" if prefix else rel] = f.read_bytes()
    return out


def _read_workspace(folder: Path, base: Path, exclude_top: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    total = 0
    for rel, data in _read_tree(folder, base, "").items():
        if rel.split("/", 1)[0] in exclude_top:
            continue
        field = f"{base.relative_to(folder).as_posix()}/{rel}"
        try:
            out[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _err(folder, field, "workspace files must be UTF-8 text") from None
        total += len(data)
        if total > MAX_WORKSPACE_BYTES:
            raise _err(folder, base.name + "/", f"workspace over {MAX_WORKSPACE_BYTES} bytes")
    return out


def _is_pytest_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")) \
        and "/.meta/" not in f"/{rel}"


def _read_tests(folder: Path) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    tests_dir = folder / "tests"
    if not tests_dir.is_dir():
        raise _err(folder, "tests/", "missing")
    tests = _read_tree(folder, tests_dir, "")
    exercism_at: dict[str, str] = {}
    cfg_path = tests_dir / ".meta" / "config.json"
    if cfg_path.is_file():
        try:
            ex_files = json.loads(cfg_path.read_text(encoding="utf-8")).get("files", {})
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError) as e:
            raise _err(folder, "tests/.meta/config.json", f"not a valid Exercism config: {e}") from None
        for path in ex_files.get("test", []) if isinstance(ex_files, dict) else []:
            if not isinstance(path, str) or path.startswith("/") or ".." in Path(path).parts:
                raise _err(folder, "tests/.meta/config.json:files.test", f"{path!r} is not a relative path")
            if path not in tests:
                raise _err(folder, "tests/.meta/config.json:files.test", f"{path!r} is not in tests/")
            exercism_at[path] = path
    run = []
    for rel in sorted(tests):
        if not (_is_pytest_file(rel) or rel in exercism_at):
            continue
        field = f"tests/{rel}"
        try:
            src = tests[rel].decode("utf-8")
            tree = parse_python(src, field)
        except (UnicodeDecodeError, SyntaxError) as e:
            raise _err(folder, field, f"not valid Python: {e}") from None
        if _ABS_TESTS_RE.search(src):
            raise _err(folder, field, "refers to the absolute path /tests ($TEST_DIR); tests run from a "
                                      "temporary folder here, so such tests are not supported")
        run.append({"src": rel, "at": exercism_at.get(rel), "expected": static_test_count(tree)})
    if not run:
        others = ", ".join(sorted(tests)) or "nothing"
        raise _err(folder, "tests/", f"no pytest files (test_*.py, *_test.py); found {others}. test.sh-only "
                                     "verifiers are not supported (they install tools over the network)")
    return tests, run


def _oracle_spec(entry: str, files: dict[str, bytes], app_files: dict[str, bytes],
                 env: dict[str, str]) -> dict[str, Any]:
    def enc(d: dict[str, bytes]) -> dict[str, str]:
        return {k: base64.b64encode(v).decode("ascii") for k, v in sorted(d.items())}

    return {"entry": entry, "files_b64": enc(files), "app_files_b64": enc(app_files), "env": env}


def _with_exercism(folder: Path, oracle: dict[str, Any] | None) -> dict[str, Any] | None:
    """Add the Exercism reference (``files.example`` -> ``files.solution``) as an oracle alternative."""
    cfg_path = folder / "tests" / ".meta" / "config.json"
    if not cfg_path.is_file():
        return oracle
    files = json.loads(cfg_path.read_text(encoding="utf-8")).get("files", {})  # validated by _read_tests
    example = files.get("example", []) if isinstance(files, dict) else []
    solution = files.get("solution", []) if isinstance(files, dict) else []
    if not (isinstance(example, list) and isinstance(solution, list) and len(example) == len(solution) == 1):
        return oracle
    src = folder / "tests" / example[0]
    if not src.is_file():
        raise _err(folder, "tests/.meta/config.json:files.example", f"{example[0]!r} is not in tests/")
    out = dict(oracle or {})
    out["exercism"] = {"from": example[0], "to": solution[0]}
    return out


def static_test_count(tree: ast.Module) -> int:
    """Tests pytest would collect from a module, counted from its syntax tree (>= 1).

    Module-level ``test*`` functions, ``test*`` methods of ``Test*`` classes without ``__init__``
    and of classes whose base name ends in ``TestCase``; each multiplied by the length of every
    ``@...parametrize(names, [literal list])`` decorator (a non-literal list counts as 1). The
    floor of 1 makes a file that fails to import count as at least one failed check.
    """

    def mult(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
        m = 1
        for d in fn.decorator_list:
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "parametrize" \
                    and len(d.args) >= 2 and isinstance(d.args[1], (ast.List, ast.Tuple)):
                m *= max(1, len(d.args[1].elts))
        return m

    def count(body: list[ast.stmt], in_class: bool) -> int:
        n = 0
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                n += mult(node)
            elif isinstance(node, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                unittest_cls = any(b.endswith("TestCase") for b in bases)
                has_init = any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body)
                if unittest_cls or (node.name.startswith("Test") and not has_init):
                    n += count(node.body, True)
        return n

    return max(1, count(tree.body, False))



# ----------------------------------------------------------------------------------------------
# grading

# The program the sandbox's python3 reads from stdin. It unpacks the hidden tests into a fresh
# private folder, runs pytest in-process with a plugin that tallies every test, and writes one
# result line, marked with a random token, to the original stdout (pytest's own output and
# anything the code under test prints go to a log file instead, so the line is never cut off).
_RUNNER = r'''
import base64, json, os, sys, tempfile
TOKEN = %(token)r
SPEC = json.loads(%(spec)r)
out_fd = os.dup(1)
def emit(mark, obj):
    os.write(out_fd, ("\n%%s %%s %%s\n" %% (mark, TOKEN, json.dumps(obj))).encode())
try:
    import pytest
except Exception as e:
    emit("HARNESSRL-TB-RESULT", {"error": "pytest is not importable in the sandbox: %%r" %% (e,)})
    sys.exit(0)
base = tempfile.mkdtemp(prefix="harnessrl-verify-")
tdir = os.path.join(base, "tests")
def put(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
for rel, text in SPEC["tests"].items():
    put(os.path.join(tdir, rel), text.encode("utf-8"))
for rel, b in SPEC["tests_b64"].items():
    put(os.path.join(tdir, rel), base64.b64decode(b))
# Every test file runs from the private folder, never from /app: no conftest.py, __init__.py or
# ini file the agent left in /app (or anywhere outside tdir) is on a test's folder path.
paths = [os.path.realpath(os.path.join(tdir, r["src"])) for r in SPEC["run"]]
# Exercism tests import the module under test from the folder they would sit in under /app: that
# folder goes at the END of sys.path (after the tests' folder, the standard library and the
# sandbox's site), and only once pytest has loaded its plugins, so a file in /app never shadows
# pytest, a plugin, the standard library or a module the tests import from elsewhere.
app_dirs = []
for r in SPEC["run"]:
    if r["at"]:
        d = os.path.dirname(os.path.join("/app", r["at"]))
        if d not in app_dirs:
            app_dirs.append(d)
ini = os.path.join(base, "pytest.ini")
put(ini, b"[pytest]\n")
for k, v in SPEC["env"].items():
    os.environ[k] = v
class Tally:
    def __init__(self):
        self.tests = {}
        self.collect_errors = set()
    def pytest_sessionstart(self, session):
        for d in app_dirs:
            if d not in sys.path:
                sys.path.append(d)
    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.add(os.path.realpath(os.path.join("/", report.nodeid.split("::")[0])))
    def pytest_runtest_logreport(self, report):
        key = report.nodeid
        ok = self.tests.get(key, True)
        self.tests[key] = ok and report.passed
tally = Tally()
log = open(os.path.join(base, "pytest.log"), "wb")
os.dup2(log.fileno(), 1)
os.dup2(log.fileno(), 2)
emit("HARNESSRL-TB-READY", {})
try:
    rc = int(pytest.main(["-c", ini, "--rootdir=/", "--confcutdir=" + tdir, "-p", "no:cacheprovider",
                          "--continue-on-collection-errors", "-q", *paths], plugins=[tally]))
except BaseException as e:
    rc = -1
    tally.crash = repr(e)
files = {p: {"passed": 0, "collected": 0, "collect_error": p in tally.collect_errors} for p in paths}
src_of = dict(zip(paths, [r["src"] for r in SPEC["run"]]))
other = {"passed": 0, "collected": 0}
ids = {}
for nodeid, ok in tally.tests.items():
    path, _, rest = nodeid.partition("::")
    real = os.path.realpath(os.path.join("/", path))
    f = files.get(real, other)
    f["collected"] += 1
    f["passed"] += int(ok)
    ids[(src_of[real] if real in src_of else os.path.relpath(real, tdir)) + "::" + rest] = bool(ok)
sys.stdout.flush()
log.flush()
out = {"rc": rc, "files": [files[p] for p in paths], "other": other, "crash": getattr(tally, "crash", None)}
if rc not in (0, 1, 5) or out["crash"]:
    with open(os.path.join(base, "pytest.log"), "rb") as f:
        out["log_tail"] = f.read()[-2000:].decode("utf-8", "replace")
if SPEC["report"] == "all":
    out["tests"] = ids
elif SPEC["report"] is not None:  # one "1"/"0" per entry: the rule of verifiers.entry_passed
    def entry_ok(e):
        hits = [ok for t, ok in ids.items() if t == e or t.startswith(e + "[")]
        return bool(hits) and all(hits)
    out["entries"] = "".join("1" if entry_ok(e) else "0" for e in SPEC["report"])
emit("HARNESSRL-TB-RESULT", out)
os._exit(0)
'''


def _last_marked(stdout: str, mark: str, token: str) -> dict[str, Any] | None:
    found = None
    prefix = f"{mark} {token} "
    for line in stdout.splitlines():
        if line.startswith(prefix):
            try:
                found = json.loads(line[len(prefix):])
            except json.JSONDecodeError:
                continue
    return found


def run_tests(spec: dict[str, Any], sandbox: "Sandbox", report: "str | list[str] | None" = None) -> dict[str, Any]:
    """Run the task's hidden tests in ``sandbox`` (its work dir as the agent left it).

    Returns ``{"passed": int, "total": int, "status": "ok" | "timeout" | "died", "files": [...]}``;
    ``files`` has one ``{"src", "passed", "total", "collect_error"}`` per test file. A timeout or
    a test process that died counts every test as failed (``passed = 0``).
    Per-test results, by test id ``<path in tests/>::<pytest node id within the file>`` (e.g.
    ``test_outputs.py::TestX::test_y[1]``; a file that failed to collect has no ids):
    ``report="all"`` adds ``"tests": {id: passed}`` (every id: the result line grows with the test
    count, so the sandbox's ``output_bytes`` must hold it); ``report=[entries]`` adds
    ``"entries": {entry: passed}`` by the rule of :func:`~tasks.records.verifiers.entry_passed`
    (one byte per entry in the result line). On a timeout or death every entry / no id passed.

    Raises:
        VerifierError: pytest missing in the sandbox, the runner failing before the tests start,
            pytest's usage (4) or internal (3) error, or the sandbox itself failing.
    """
    from tasks.environments.sandbox import SandboxError

    token = secrets.token_hex(16)
    program = _RUNNER % {"token": token, "spec": json.dumps(
        {"tests": spec["tests"], "tests_b64": spec["tests_b64"], "run": spec["run"], "env": spec["env"],
         "report": report})}
    try:
        res = sandbox.exec(["python3", "-s", "-P", "-"], stdin=program, timeout_s=float(spec["timeout_s"]))
    except SandboxError as e:
        raise VerifierError(f"terminal-bench task {spec['task']}: the sandbox failed while the tests ran: {e}") from e
    expected = [int(r["expected"]) for r in spec["run"]]
    ready = _last_marked(res.stdout, READY_MARK, token)
    result = _last_marked(res.stdout, RESULT_MARK, token)
    if result is not None and "error" in result:
        raise VerifierError(f"terminal-bench task {spec['task']}: {result['error']}")
    if ready is None:
        raise VerifierError(f"terminal-bench task {spec['task']}: the test runner did not start "
                            f"(status {res.status}, exit {res.exit_code}): {res.combined_output()[-1500:]}")
    zero = [{"src": r["src"], "passed": 0, "total": e, "collect_error": False} for r, e in zip(spec["run"], expected)]
    if result is None:
        status = "timeout" if res.status == "timeout" else "died"
        out: dict[str, Any] = {"passed": 0, "total": sum(expected), "status": status, "files": zero}
        if report == "all":
            out["tests"] = {}
        elif report is not None:
            out["entries"] = {e: False for e in report}
        return out
    if result["rc"] in (3, 4) or result["crash"]:
        raise VerifierError(f"terminal-bench task {spec['task']}: pytest failed to run (exit {result['rc']}, "
                            f"{result['crash']}): {result.get('log_tail', '')[-1500:]}")
    files = []
    for r, e, f in zip(spec["run"], expected, result["files"]):
        if f["collect_error"]:
            files.append({"src": r["src"], "passed": 0, "total": max(e, f["collected"], 1), "collect_error": True})
        else:
            files.append({"src": r["src"], "passed": f["passed"], "total": max(e, f["collected"]),
                          "collect_error": False})
    other = result["other"]
    passed = sum(f["passed"] for f in files) + other["passed"]
    total = sum(f["total"] for f in files) + other["collected"]
    out = {"passed": passed, "total": total, "status": "ok", "files": files}
    if report == "all":
        out["tests"] = dict(sorted(result["tests"].items()))
    elif report is not None:
        if len(result["entries"]) != len(report):
            raise VerifierError(f"terminal-bench task {spec['task']}: {len(result['entries'])} entry results for "
                                f"{len(report)} entries")
        out["entries"] = {e: b == "1" for e, b in zip(report, result["entries"])}
    return out


@register_verifier(VERIFIER_KIND)
def grade_terminal_bench(spec: dict[str, Any], answer: str | None, ctx: GradeContext | None) -> float:
    """The reward of the episode's sandbox (``answer`` unused: the work dir is what is graded).

    Spec without ``reward`` (the default rule ``fraction``): the fraction of the hidden pytest
    checks that pass. ``reward: "p6"``: :func:`~tasks.records.verifiers.p6_reward` over the
    spec's ``fail_to_pass`` / ``pass_to_pass`` ids and the run's per-test results.

    Raises:
        VerifierError: no sandbox; an unknown ``reward``; see :func:`run_tests`.
    """
    if ctx is None:
        raise VerifierError(f"verifier {VERIFIER_KIND!r} needs the episode's sandbox (ctx is None)")
    rule = spec.get("reward", "fraction")
    if rule not in REWARD_RULES:
        raise VerifierError(f"terminal-bench task {spec['task']}: reward rule {rule!r} not in {REWARD_RULES}")
    if rule == "p6":
        entries = list(dict.fromkeys(spec["fail_to_pass"] + spec["pass_to_pass"]))
        r = run_tests(spec, ctx.sandbox(), report=entries)
        return p6_reward(spec["fail_to_pass"], spec["pass_to_pass"], r["entries"])
    r = run_tests(spec, ctx.sandbox())
    return r["passed"] / r["total"] if r["total"] else 0.0


# ----------------------------------------------------------------------------------------------
# fail-to-pass / pass-to-pass lists (reward rule p6)

MAX_P6_ENTRIES = 2000  # listed tests per task: one byte each in a result line that sandbox.output_bytes (4096) cuts
LISTS_FILE = "harnessrl-tests.json"  # sidecar in a task folder (not a task file: the loader never shows it)
# SandboxConfig fields for compute_test_lists at load: room for every test id in the result line
LISTS_SANDBOX = {"backend": "bwrap", "wall_s": 60.0, "cpu_s": 60, "output_bytes": 16 << 20, "output_kill_bytes": 32 << 20}


def lists_key(spec: dict[str, Any], workspace_files: dict[str, str]) -> str:
    """SHA-256 of what the lists depend on (hidden tests, how they run, the oracle, the untouched
    workspace): a :data:`LISTS_FILE` whose ``key`` differs is stale."""
    from tasks.hashing import sha256_json

    return sha256_json({k: spec[k] for k in ("tests", "tests_b64", "run", "env", "oracle")} | {"workspace": workspace_files})


def static_test_ids(tree: ast.Module) -> list[str]:
    """Test function ids (``name`` / ``Class::name``) pytest would collect from a module, read from
    its syntax tree (the same rules as :func:`static_test_count`); parametrized instances are
    covered by the function id (see :func:`~tasks.records.verifiers.entry_passed`)."""
    out: list[str] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                out.append(prefix + node.name)
            elif isinstance(node, ast.ClassDef) and not prefix:
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                has_init = any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body)
                if any(b.endswith("TestCase") for b in bases) or (node.name.startswith("Test") and not has_init):
                    walk(node.body, node.name + "::")

    walk(tree.body, "")
    return out


def _fresh_run(spec: dict[str, Any], files: dict[str, str], sandbox_cfg: Any, oracle: bool) -> dict[str, Any]:
    from pathlib import PurePosixPath

    from tasks.environments.sandbox import make_sandbox

    sb = make_sandbox(sandbox_cfg)
    try:
        dirs = sorted({str(PurePosixPath(p).parent) for p in files} - {"."})
        if dirs:  # made by the sandbox user first, as the episode's set-up does
            r = sb.exec(["mkdir", "-p", "--", *dirs])
            if r.status != "ok":
                raise VerifierError(f"terminal-bench task {spec['task']}: mkdir in the sandbox: {r.combined_output()}")
        for path, text in sorted(files.items()):
            sb.write_file(path, text)
        if oracle:
            run_oracle(spec, sb, timeout_s=float(spec["timeout_s"]))
        return run_tests(spec, sb, report="all")
    finally:
        sb.cleanup()


def compute_test_lists(spec: dict[str, Any], workspace_files: dict[str, str], sandbox_cfg: Any = None) -> dict[str, Any]:
    """Fail-to-pass and pass-to-pass test ids of one task, by running its hidden tests in fresh
    sandboxes: once on the untouched workspace, and once after the oracle when the task has one.

    ``sandbox_cfg``: a :class:`~tasks.config.SandboxConfig` (None: :data:`LISTS_SANDBOX`). Never
    the agent's sandbox: these sandboxes are made here and removed after the run.
    With an oracle that runs: ``fail_to_pass`` = ids that pass after the oracle and did not pass
    on the untouched workspace (a file that failed to import there counts all its tests as not
    passed), ``pass_to_pass`` = ids that pass both times; ids that fail after the oracle are in
    neither list (no policy can be asked to pass them), as SWE-bench builds its lists from the gold
    patch. Without an oracle, or when it fails (e.g. it needs a tool the sandbox lacks):
    ``fail_to_pass`` = ids not passing on the untouched workspace, plus the static function ids
    (:func:`static_test_ids`) of files that failed to import there; ``pass_to_pass`` = ids passing.
    Returns ``{"fail_to_pass": [ids, sorted], "pass_to_pass": [...], "lists_oracle_checked": bool}``.

    Raises:
        VerifierError: the tests cannot run (see :func:`run_tests`); the untouched run timed out.
    """
    from tasks.config import SandboxConfig

    cfg = sandbox_cfg or SandboxConfig(**LISTS_SANDBOX)
    before = _fresh_run(spec, workspace_files, cfg, oracle=False)
    if before["status"] != "ok":
        raise VerifierError(f"terminal-bench task {spec['task']}: the hidden tests {before['status']} on the "
                            "untouched workspace; no fail-to-pass/pass-to-pass lists")
    after = None
    if spec.get("oracle"):
        try:
            after = _fresh_run(spec, workspace_files, cfg, oracle=True)
        except (RuntimeError, ValueError):  # the oracle script failed or cannot run here (VerifierError too)
            after = None
        if after is not None and after["status"] != "ok":
            after = None
    b = before["tests"]
    if after is not None:
        passing = [t for t, ok in after["tests"].items() if ok]
        f2p = [t for t in passing if not b.get(t, False)]
        p2p = [t for t in passing if b.get(t, False)]
    else:
        f2p = [t for t, ok in b.items() if not ok]
        p2p = [t for t, ok in b.items() if ok]
        for r, f in zip(spec["run"], before["files"]):
            if f["collect_error"]:
                f2p += [f"{r['src']}::{n}" for n in static_test_ids(parse_python(spec["tests"][r["src"]]))]
    return {"fail_to_pass": sorted(f2p), "pass_to_pass": sorted(p2p), "lists_oracle_checked": after is not None}


def write_lists_file(folder: Path, lists: dict[str, Any], key: str) -> None:
    """Write ``folder/LISTS_FILE`` (canonical JSON, sorted keys, trailing newline)."""
    (folder / LISTS_FILE).write_text(json.dumps({"key": key, **lists}, indent=1, sort_keys=True) + "\n",
                                     encoding="utf-8")


_COMPUTED: dict[str, dict[str, Any]] = {}  # lists_key -> compute_test_lists result, this process


def _lists_for(folder: Path, spec: dict[str, Any], workspace_files: dict[str, str]) -> dict[str, Any]:
    key = lists_key(spec, workspace_files)
    path = folder / LISTS_FILE
    if path.is_file():
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _err(folder, LISTS_FILE, f"not valid JSON: {e}") from None
        want = {"key", "fail_to_pass", "pass_to_pass", "lists_oracle_checked"}
        if not isinstance(d, dict) or set(d) != want:
            raise _err(folder, LISTS_FILE, f"expected exactly the keys {sorted(want)}")
        for k in ("fail_to_pass", "pass_to_pass"):
            if not isinstance(d[k], list) or not all(isinstance(t, str) for t in d[k]):
                raise _err(folder, f"{LISTS_FILE}:{k}", f"{d[k]!r} is not a list of test ids")
        if d["key"] != key:
            raise _err(folder, f"{LISTS_FILE}:key", "stale: the tests, oracle or workspace changed since the lists "
                                                    "were computed (builtin: rerun generate.py; else delete the file)")
        lists = {k: d[k] for k in ("fail_to_pass", "pass_to_pass", "lists_oracle_checked")}
    else:
        if key not in _COMPUTED:  # a suite loaded twice in one process runs the tests once
            _COMPUTED[key] = compute_test_lists(spec, workspace_files)
        lists = dict(_COMPUTED[key])
    if len(lists["fail_to_pass"]) + len(lists["pass_to_pass"]) > MAX_P6_ENTRIES:
        raise _err(folder, "tests/", f"reward p6: {len(lists['fail_to_pass']) + len(lists['pass_to_pass'])} listed "
                                     f"tests, over {MAX_P6_ENTRIES} (their results must fit the grading run's output)")
    if not lists["fail_to_pass"] and not lists["pass_to_pass"]:
        raise _err(folder, "tests/", "reward p6: no test passes after the oracle, so there is no "
                                     "fail-to-pass or pass-to-pass test to grade by")
    return lists


# ----------------------------------------------------------------------------------------------
# oracle (our tests and dataset checks only; never part of an episode)

_ORACLE = r'''
import base64, json, os, subprocess, sys, tempfile
SPEC = json.loads(%(spec)r)
base = tempfile.mkdtemp(prefix="harnessrl-oracle-")
def put(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
for rel, b in SPEC["app_files_b64"].items():
    put(os.path.join("/app", rel), base64.b64decode(b))
for rel, b in SPEC["files_b64"].items():
    put(os.path.join(base, rel), base64.b64decode(b))
env = dict(os.environ, **SPEC["env"])
r = subprocess.run(["bash", os.path.join(base, SPEC["entry"])], cwd="/app", env=env)
sys.exit(r.returncode)
'''


def run_oracle(spec: dict[str, Any], sandbox: "Sandbox", *, method: str = "auto", timeout_s: float = 60.0) -> None:
    """Apply the task's reference solution to ``sandbox``'s work dir (for oracle checks only).

    ``method``: ``script`` (solution.sh / solution/solve.sh run with bash in /app, TB1's
    ``workspace/.oracle`` files put back in /app first), ``exercism`` (copy the Exercism
    ``.meta/example.py`` to the solution module), or ``auto`` (``exercism`` when the task has it --
    it needs no tools -- else ``script``). ``timeout_s``: wall seconds for the script.

    Raises:
        ValueError: the task has no oracle of that method, or its script reads /solution or
            /oracle paths (Harbor mounts the solution folder there; the sandbox has no such path).
        RuntimeError: the oracle script failed (the message has its output).
    """
    oracle = spec.get("oracle") or {}
    if method == "auto":
        method = "exercism" if "exercism" in oracle else "script"
    if method == "exercism":
        ex = oracle.get("exercism")
        if ex is None:
            raise ValueError(f"terminal-bench task {spec['task']}: no Exercism reference solution")
        sandbox.write_file(ex["to"], spec["tests"][ex["from"]])
        return
    if method != "script" or "entry" not in oracle:
        raise ValueError(f"terminal-bench task {spec['task']}: no oracle of method {method!r}")
    script = base64.b64decode(oracle["files_b64"][oracle["entry"]]).decode("utf-8", "replace")
    if _ABS_SOLUTION_RE.search(script):
        raise ValueError(f"terminal-bench task {spec['task']}: oracle {oracle['entry']} reads files from an "
                         "absolute /solution or /oracle path, which the sandbox does not have")
    prog = _ORACLE % {"spec": json.dumps({k: oracle[k] for k in ("entry", "files_b64", "app_files_b64", "env")})}
    res = sandbox.exec(["python3", "-s", "-P", "-"], stdin=prog, timeout_s=timeout_s)
    if res.status != "ok":
        raise RuntimeError(f"terminal-bench task {spec['task']}: oracle {oracle['entry']} {res.status} "
                           f"(exit {res.exit_code}): {res.combined_output()[-2000:]}")
