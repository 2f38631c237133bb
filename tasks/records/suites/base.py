"""The task record every suite loader yields, and the loader registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

from tasks.config import SuiteConfig
from tasks.hashing import canonical_json, sha256_json


# What an episode of the task acts on:
#   answer    - nothing but its own reply (math): graded on the submitted answer; a scratch sandbox
#               is still there for harnesses that run code;
#   workspace - a sandbox work dir (/app) prepared from ``Task.workspace``; graded by running hidden
#               tests in that sandbox after the agent has finished (HumanEval, terminal tasks);
#   browser   - a web page in headless Chromium (MiniWoB++); graded by the page's own reward.
TaskEnvironment = Literal["answer", "workspace", "browser"]
ENVIRONMENTS: tuple[str, ...] = ("answer", "workspace", "browser")


@dataclass(frozen=True)
class Task:
    """One task.

    ``instruction`` and ``workspace`` are all the agent ever sees of it. ``verifier_spec`` holds
    what grades it (the reference answer, hidden tests); it is read only by
    :mod:`tasks.records.verifiers`, after the episode has finished, and never rendered into a
    prompt or copied into the sandbox before then.

    ``workspace`` (visible set-up, ``environment == "workspace"`` only)::

        {"files": {"relative/path": "text", ...},   # written into the work dir before the agent starts
         "setup": ["shell command", ...],           # then run there with ``sh -c``, in order
         "answer_file": "solution.py"}              # optional: single-turn harnesses write the final
                                                    # code block of their reply to this file
    """

    task_id: str
    suite: str
    instruction: str
    verifier_kind: str
    verifier_spec: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    environment: TaskEnvironment = "answer"
    workspace: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.environment not in ENVIRONMENTS:
            raise ValueError(f"task {self.task_id!r}: environment={self.environment!r}; expected one of {ENVIRONMENTS}")
        bad = set(self.workspace) - {"files", "setup", "answer_file"}
        if bad:
            raise ValueError(f"task {self.task_id!r}: workspace has unknown key(s) {sorted(bad)}")
        if self.workspace and self.environment != "workspace":
            raise ValueError(f"task {self.task_id!r}: workspace given for environment {self.environment!r}")

    @property
    def task_hash(self) -> str:
        """SHA-256 of (suite, instruction, environment, workspace, verifier): the task's content identity."""
        return sha256_json(
            {"suite": self.suite, "instruction": self.instruction, "environment": self.environment,
             "workspace": self.workspace, "verifier_kind": self.verifier_kind, "verifier_spec": self.verifier_spec}
        )

    def to_row(self, split: str) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "suite": self.suite,
            "split": split,
            "instruction": self.instruction,
            "environment": self.environment,
            "workspace": canonical_json(self.workspace),
            "verifier_kind": self.verifier_kind,
            "verifier_spec": canonical_json(self.verifier_spec),
            "metadata": canonical_json(self.metadata),
            "task_hash": self.task_hash,
        }


Loader = Callable[[SuiteConfig], Iterator[Task]]
_LOADERS: dict[str, Loader] = {}
# Modules that register loaders (``suites[].source`` values) and verifiers.
_SUITE_MODULES = ["tasks.records.suites.reasoning_gym",
                  "tasks.records.suites.terminal_bench",
                  "tasks.records.suites.humaneval",
                  "tasks.records.suites.miniwob"]


def register_loader(source: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        _LOADERS[source] = fn
        return fn

    return deco


def import_suite_modules() -> None:
    """Import every suite module so that its loader and verifiers are registered."""
    import importlib

    for mod in _SUITE_MODULES:
        importlib.import_module(mod)


def load_suite(cfg: SuiteConfig) -> list[Task]:
    """All tasks of one suite config, in the loader's order.

    Raises:
        ValueError: unknown ``source`` (the message lists the known ones).
    """
    import_suite_modules()
    if cfg.source not in _LOADERS:
        raise ValueError(f"suites[].source={cfg.source!r} has no loader; known: {sorted(_LOADERS)}")
    return list(_LOADERS[cfg.source](cfg))
