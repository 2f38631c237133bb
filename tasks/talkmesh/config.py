"""Config of a TalkMesh run (P3): a :class:`tasks.config.RunConfig` with a ``talkmesh`` section
(a subclass, like BiPA's, so the pipeline's config and its hashes are unchanged). The run's
``train`` section configures the talk policy's GRPO (the same trainer as the pipeline's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.config import RunConfig, load_config
from tasks.harnesses.spec import SamplingSpec


class HeadConfig(BaseModel):
    """The confidence head: ``l2`` penalty, L-BFGS ``steps``, ECE ``bins``, ``batch_size`` of the
    hidden-state passes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    l2: float = Field(default=1e-2, ge=0)
    steps: int = Field(default=100, ge=1)
    bins: int = Field(default=10, ge=1, le=100)
    batch_size: int = Field(default=16, ge=1)


class TalkMeshConfig(BaseModel):
    """The mesh, its training data and its evaluation.

    ``harness``: the harness whose system prompt and answer pattern the agents use (one of
    ``harnesses``). ``train_problems`` / ``test_problems``: the first problems (by task hash) of
    the frozen train / test split. ``train_samples``: proposals per training problem (the head's
    data; the first ``agents`` are the training mesh's agents). ``samples``: samples per test
    problem for the vote baselines, K (k = 1..K; the mesh's agents are the first ``agents``).
    ``agents`` N, ``topology``, ``degree`` (regular), ``rounds``, ``threshold``, ``gossip_steps``:
    :class:`tasks.talkmesh.protocol.MeshSettings`. ``talk_group``: mesh runs per training problem
    (different talk seeds) whose revisions form one GRPO group. ``train_talk``: train the talk
    adapter (false: the mesh talks with the base model only). ``colluders``: the values of m for
    the collusion experiment (each < agents). ``resamples``: orderings averaged in the vote curves.
    ``bootstrap_resamples``: problem resamples of the paired contrasts' intervals.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str = "direct"
    train_problems: int = Field(default=40, ge=1)
    test_problems: int = Field(default=40, ge=1)
    train_samples: int = Field(default=8, ge=2)
    samples: int = Field(default=32, ge=1, le=256)
    agents: int = Field(default=8, ge=2, le=256)
    topology: Literal["full", "ring", "regular"] = "full"
    degree: int = Field(default=2, ge=1)
    rounds: int = Field(default=1, ge=0, le=16)
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    gossip_steps: int | None = Field(default=None, ge=1)
    talk_group: int = Field(default=4, ge=1)
    train_talk: bool = True
    colluders: list[int] = Field(default_factory=lambda: [4])
    resamples: int = Field(default=16, ge=1)
    bootstrap_resamples: int = Field(default=2000, ge=1)
    proposal_sampling: SamplingSpec = Field(default_factory=lambda: SamplingSpec(temperature=0.7, max_new_tokens=256))
    talk_sampling: SamplingSpec = Field(default_factory=lambda: SamplingSpec(temperature=0.7, max_new_tokens=128))
    max_solution_chars: int = Field(default=600, ge=50)
    head: HeadConfig = Field(default_factory=HeadConfig)

    @model_validator(mode="after")
    def _check(self) -> "TalkMeshConfig":
        if self.agents > self.samples:
            raise ValueError(f"talkmesh.agents={self.agents} exceeds talkmesh.samples={self.samples}: the agents' "
                             "proposals are the first samples")
        if self.agents > self.train_samples:
            raise ValueError(f"talkmesh.agents={self.agents} exceeds talkmesh.train_samples={self.train_samples}")
        bad = [m for m in self.colluders if not 1 <= m < self.agents]
        if bad:
            raise ValueError(f"talkmesh.colluders={self.colluders}: each m must be in [1, agents-1={self.agents - 1}]")
        if self.topology == "regular":
            from tasks.harnesses.topology import build_topology

            build_topology("regular", self.agents, self.degree, 0)  # raises on an impossible degree
        return self


class TalkMeshRunConfig(RunConfig):
    """A run config with the ``talkmesh`` section (required)."""

    talkmesh: TalkMeshConfig

    @model_validator(mode="after")
    def _check_talkmesh(self) -> "TalkMeshRunConfig":
        if self.talkmesh.harness not in self.harnesses:
            raise ValueError(f"talkmesh.harness={self.talkmesh.harness!r} is not in harnesses {self.harnesses}")
        return self


def load_talkmesh_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TalkMeshRunConfig:
    """Load and validate a TalkMesh run config from YAML (``overrides`` as in
    :func:`tasks.config.load_config`).

    Raises:
        ConfigError: missing file, not YAML, not a mapping, or a validation failure (names the
            file, key path and value).
    """
    return load_config(path, overrides, model=TalkMeshRunConfig)  # type: ignore[return-value]
