"""The task record every suite loader yields, and the loader registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tasks.config import SuiteConfig
from tasks.hashing import canonical_json, sha256_json


@dataclass(frozen=True)
class Task:
    """One task.

    ``instruction`` is all the agent ever sees of it. ``verifier_spec`` holds what grades it (the
    reference answer, hidden tests); it is read only by :mod:`tasks.records.verifiers`, after the
    episode has finished, and never rendered into a prompt.
    """

    task_id: str
    suite: str
    instruction: str
    verifier_kind: str
    verifier_spec: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def task_hash(self) -> str:
        """SHA-256 of (suite, instruction, verifier): the task's content identity."""
        return sha256_json(
            {"suite": self.suite, "instruction": self.instruction, "verifier_kind": self.verifier_kind,
             "verifier_spec": self.verifier_spec}
        )

    def to_row(self, split: str) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "suite": self.suite,
            "split": split,
            "instruction": self.instruction,
            "verifier_kind": self.verifier_kind,
            "verifier_spec": canonical_json(self.verifier_spec),
            "metadata": canonical_json(self.metadata),
            "task_hash": self.task_hash,
        }


Loader = Callable[[SuiteConfig], Iterator[Task]]
_LOADERS: dict[str, Loader] = {}


def register_loader(source: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        _LOADERS[source] = fn
        return fn

    return deco


def load_suite(cfg: SuiteConfig) -> list[Task]:
    """All tasks of one suite config, in the loader's order.

    Raises:
        ValueError: unknown ``source`` (the message lists the known ones).
    """
    from tasks.records.suites import reasoning_gym  # noqa: F401  (registers its loader)

    if cfg.source not in _LOADERS:
        raise ValueError(f"suites[].source={cfg.source!r} has no loader; known: {sorted(_LOADERS)}")
    return list(_LOADERS[cfg.source](cfg))
