"""Config of a BiPA run (P2): a :class:`tasks.config.RunConfig` with a ``bipa`` section.

``BipaRunConfig`` subclasses ``RunConfig`` instead of adding a field to it, so the pipeline's
config (and every existing run folder's config hash) is unchanged, and everything that takes a
``RunConfig`` (freeze, ``run_records``, ``PolicySource``) takes this one as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.bipa.findings_config import BipaFindings
from tasks.bipa.replay import AcceptRule
from tasks.config import PolicyConfig, RunConfig, load_config
from tasks.harnesses.spec import SamplingSpec


class BipaConfig(BaseModel):
    """The skill optimizer and its replay.

    ``harness``: the harness spec whose ``skill`` is optimised (it must be in ``harnesses`` and
    have a skill; None: the first harness that has one). ``candidates``: rewrites proposed, one
    after another, each of the incumbent. ``selection_tasks``: train-split tasks scored for
    acceptance (the first ones in the frozen ``tasks`` order, i.e. by task hash);
    ``test_tasks``: held-out (test-split) tasks for the replay. ``samples``: episodes per task per
    score. ``accept``: the acceptance rule. ``proposer``: the engine that writes rewrites (None:
    the policy itself); ``proposer_sampling``: its sampler. ``max_skill_chars``: a proposal is cut
    to this many characters at a line end. ``bootstrap``: resamples for the selection-effect
    interval. ``findings``: the sealed, pre-registered measurement
    (:mod:`tasks.bipa.findings_config`); a config with it runs :mod:`tasks.bipa.sealed_run`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str | None = None
    candidates: int = Field(default=3, ge=1, le=1000)
    selection_tasks: int = Field(default=6, ge=1)
    test_tasks: int = Field(default=6, ge=1)
    samples: int = Field(default=2, ge=1)
    accept: AcceptRule = Field(default_factory=AcceptRule)
    proposer: PolicyConfig | None = None
    proposer_sampling: SamplingSpec = Field(default_factory=lambda: SamplingSpec(temperature=0.8,
                                                                                 max_new_tokens=160))
    max_skill_chars: int = Field(default=1500, ge=16)
    bootstrap: int = Field(default=1000, ge=0, le=1_000_000)
    findings: BipaFindings | None = None


class BipaRunConfig(RunConfig):
    """A run config with the ``bipa`` section (required)."""

    bipa: BipaConfig

    @model_validator(mode="after")
    def _check_bipa(self) -> "BipaRunConfig":
        self.seed_harness_name()
        if self.bipa.findings is not None:
            if not self.split.disjoint:
                raise ValueError("split.disjoint=False: a findings config (bipa.findings) needs split.disjoint: true")
            lax = [s.name for s in self.suites if s.reward != "exact"]
            if lax:
                raise ValueError(f"suites {lax}: a findings config (bipa.findings) needs reward: exact")
            if self.policy.engine != "vllm":
                raise ValueError(f"policy.engine={self.policy.engine!r}: bipa.findings replays with common random "
                                 "numbers, which need per-request seeds (policy.engine: vllm)")
        return self

    def seed_harness_name(self) -> str:
        """The harness whose skill is optimised.

        Raises:
            ValueError: ``bipa.harness`` is not in ``harnesses`` or has no skill; or no harness has one.
        """
        from tasks.harnesses.spec import load_harness

        if self.bipa.harness is not None:
            if self.bipa.harness not in self.harnesses:
                raise ValueError(f"bipa.harness={self.bipa.harness!r} is not in harnesses {self.harnesses}")
            if not load_harness(self.bipa.harness).skill:
                raise ValueError(f"bipa.harness={self.bipa.harness!r} has no skill section to optimise")
            return self.bipa.harness
        for h in self.harnesses:
            if load_harness(h).skill:
                return h
        raise ValueError(f"bipa: none of harnesses {self.harnesses} has a skill section; add one "
                         "(e.g. react-python-skill) or set bipa.harness")


def load_bipa_config(path: str | Path, overrides: dict[str, Any] | None = None, *, quick: bool = False
                     ) -> BipaRunConfig:
    """Load and validate a BiPA run config from YAML (``overrides`` and ``quick`` as in
    :func:`tasks.config.load_config`).

    Raises:
        ConfigError: missing file, not YAML, not a mapping, or a validation failure (names the
            file, key path and value).
    """
    return load_config(path, overrides, model=BipaRunConfig, quick=quick)  # type: ignore[return-value]
