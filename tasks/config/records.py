"""The freeze stage's sections: ``suites`` (task suites) and ``split``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from tasks.config.base import _Strict


class SuiteConfig(_Strict):
    """One task suite to freeze.

    ``source`` selects the loader under ``tasks/records/suites/``; ``name`` is the suite's dataset
    name there (for reasoning-gym: ``basic_arithmetic``, ``gsm_symbolic``, ...); ``size`` tasks are
    generated with ``seed``; ``params`` go to the generator unchanged. ``terminal_bench``: ``name``
    is a folder of task folders or ``builtin``; ``humaneval``: ``name`` is ``HumanEval``; for both
    ``size`` caps the count. ``miniwob``: ``name`` is a comma-separated list of MiniWoB++ env names
    or a preset (``basic``), ``size`` instances in all, ``params`` must be empty (see each source's
    module under ``tasks/records/suites/``).
    """

    source: Literal["reasoning_gym", "terminal_bench", "humaneval", "miniwob"] = "reasoning_gym"
    name: str
    size: int = Field(gt=0, le=100_000)
    seed: int = 0
    params: dict[str, Any] = Field(default_factory=dict)
    eval_only: bool = False
    # Reward rule of the suite's verifier (part of each task's verifier_spec, so frozen and hashed):
    # "fraction" = fraction of the hidden checks passed (HumanEval: the one check); "p6" = passed
    # fail-to-pass tests / their count, forced to 0 when a pass-to-pass test fails (P6: docs/methods/p6-gspo-lora.md;
    # terminal_bench and humaneval only; see tasks/records/suites/terminal_bench.py); "exact"
    # (reasoning_gym only) = 1.0 iff the answer equals the reference (numbers compared as numbers),
    # else 0.0: no partial credit (reasoning-gym's own score_answer gives 0.5 to "-2" for "2").
    reward: Literal["fraction", "p6", "exact"] = "fraction"

    @model_validator(mode="after")
    def _check_source(self) -> "SuiteConfig":
        if self.reward == "p6" and self.source not in ("terminal_bench", "humaneval"):
            raise ValueError(f"suites[].reward='p6' needs per-test fail-to-pass/pass-to-pass lists, which source "
                             f"{self.source!r} has not (only terminal_bench and humaneval)")
        if self.reward == "exact" and self.source != "reasoning_gym":
            raise ValueError(f"suites[].reward='exact' compares a submitted answer with a reference answer, which "
                             f"source {self.source!r} has not (only reasoning_gym)")
        if self.source == "reasoning_gym":
            from reasoning_gym.factory import DATASETS

            if self.name not in DATASETS:
                near = sorted(n for n in DATASETS if n.split("_")[0] == self.name.split("_")[0])[:8]
                raise ValueError(f"suites[].name={self.name!r} is not a reasoning-gym dataset"
                                 + (f" (similar: {near})" if near else ""))
        if self.source == "terminal_bench" and self.name != "builtin" and not Path(self.name).is_dir():
            raise ValueError(f"suites[].name={self.name!r}: no such folder (terminal_bench needs 'builtin' or a "
                             "folder of task folders)")
        if self.source == "miniwob" and self.params:
            raise ValueError(f"suites[].params={dict(self.params)!r}: the miniwob source takes no params")
        return self


class SplitConfig(_Strict):
    """Train/test split by task hash: tasks sorted by ``task_hash``; the first
    ``round(test_fraction * n)`` of each suite are ``test``, the rest ``train``. With ``disjoint``
    the split is by problem instead (:func:`tasks.records.overlap.disjoint_split`)."""

    test_fraction: float = Field(default=0.3, gt=0.0, lt=1.0)
    # Held out means held out: keep tasks that share a prompt or a normalised problem (for
    # arithmetic, the same expression) on one side, so no test task is a train task drawn twice,
    # and refuse a freeze whose test tasks still share a problem with train (tasks.records.overlap).
    # Off by default so that existing configs keep their splits; every findings config sets it.
    disjoint: bool = False
