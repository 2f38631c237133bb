"""Config of a TalkMesh run (P3): a :class:`tasks.config.RunConfig` with a ``talkmesh`` section
(a subclass, like BiPA's, so the pipeline's config and its hashes are unchanged). The run's
``train`` section configures the talk policy's GRPO (the same trainer as the pipeline's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.config import RunConfig, load_config
from tasks.config.base import LaterOptions
from tasks.harnesses.spec import SamplingSpec


class HeadConfig(BaseModel):
    """The confidence head: ``l2`` penalty, L-BFGS ``steps``, ECE ``bins``, ``batch_size`` of the
    hidden-state passes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    l2: float = Field(default=1e-2, ge=0)
    steps: int = Field(default=100, ge=1)
    bins: int = Field(default=10, ge=1, le=100)
    batch_size: int = Field(default=16, ge=1)


class MeshFinding(BaseModel):
    """One pre-registered finding of a TalkMesh run (docs/experiments/findings-rules.md, P3): the
    mesh of ``agents`` agents with the trained talk policy (the base one when ``train_talk`` is
    off) against majority vote over ``k`` samples of the same test problems. The measure is the
    mean over problems of (mesh accuracy - majority@k accuracy); ``claim`` and ``margin`` decide
    the verdict by :func:`tasks.evaluate.findings.verdict`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")
    headline: str = Field(min_length=1)
    agents: int = Field(ge=2)
    k: int = Field(ge=1)
    claim: Literal["increase", "no_increase", "equivalent"] = "equivalent"
    margin: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _check(self) -> "MeshFinding":
        if self.claim == "equivalent" and self.margin <= 0:
            raise ValueError(f"talkmesh.findings.rules[{self.name!r}].margin={self.margin}: an 'equivalent' claim "
                             "needs a margin > 0")
        return self


class MeshFindings(BaseModel):
    """The run's pre-registered findings: ``rules`` (:class:`MeshFinding`), the family-wise
    ``alpha`` (each interval at level ``1 - alpha / len(rules)``, Bonferroni), and the
    ``bootstrap_resamples`` of the problem bootstrap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    bootstrap_resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    rules: list[MeshFinding] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "MeshFindings":
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"talkmesh.findings.rules: names must be unique, got {names}")
        return self


class TalkMeshConfig(LaterOptions):
    """The mesh, its training data and its evaluation.

    ``harness``: the harness whose system prompt and answer pattern the agents use (one of
    ``harnesses``). ``train_problems`` / ``test_problems``: the first problems (by task hash) of
    the frozen train / test split. ``train_samples``: proposals per training problem (the head's
    data; the first ``agents`` are the training mesh's agents). ``samples``: samples per test
    problem for the vote baselines, K (k = 1..K; the mesh's agents are the first ``agents``).
    ``agents`` N, ``topology``, ``degree`` (regular), ``rounds``, ``threshold``, ``gossip_steps``:
    :class:`tasks.talkmesh.mesh.MeshSettings`. ``talk_group``: mesh runs per training problem
    (different talk seeds) whose revisions form one GRPO group. ``train_talk``: train the talk
    adapter (false: the mesh talks with the base model only). ``colluders``: the values of m for
    the collusion experiment (each < agents). ``resamples``: orderings averaged in the vote curves.
    ``bootstrap_resamples``: problem resamples of the paired contrasts' intervals.

    Options added for the findings run (unset: left out of every dump, so older configs keep
    their hashes): ``distinct_problems``: pick one task per normalised problem
    (:func:`tasks.records.overlap.problem_key`), so that no two test problems are draws of the
    same expression. ``mesh_sizes``: further mesh sizes evaluated with the trained talk policy
    (conditions ``mesh-talk-n<N>``). ``mesh_repeats`` R: every evaluated mesh runs R times per
    test problem, repeat r on samples ``[r*N, (r+1)*N)`` (R * N <= ``samples``), and its
    per-problem accuracy is the mean over the repeats. ``findings``: :class:`MeshFindings`.
    """

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
    distinct_problems: bool | None = None
    mesh_sizes: list[int] | None = None
    mesh_repeats: int | None = Field(default=None, ge=1)
    findings: MeshFindings | None = None
    # added later: unset, they stay out of the dumps, so older talkmesh configs keep their hashes
    _later: ClassVar[tuple[str, ...]] = ("distinct_problems", "mesh_sizes", "mesh_repeats", "findings")

    def sizes(self) -> list[int]:
        """Every evaluated mesh size with the trained talk policy: ``agents``, then ``mesh_sizes``."""
        return [self.agents] + list(self.mesh_sizes or [])

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
            from tasks.talkmesh.topology import build_topology

            build_topology("regular", self.agents, self.degree, 0)  # raises on an impossible degree
        sizes = self.sizes()
        if self.mesh_sizes is not None and (len(set(sizes)) != len(sizes) or min(sizes) < 2):
            raise ValueError(f"talkmesh.mesh_sizes={self.mesh_sizes}: each size must be >= 2 and differ from the "
                             f"others and from talkmesh.agents={self.agents}")
        if self.mesh_sizes is not None and self.topology == "regular":
            raise ValueError("talkmesh.mesh_sizes: further mesh sizes are built for topology full or ring only, "
                             "got regular")
        reps = self.mesh_repeats or 1
        if reps * max(sizes) > self.samples:
            raise ValueError(f"talkmesh.mesh_repeats={reps}: {reps} repeats of the largest mesh ({max(sizes)} agents) "
                             f"need {reps * max(sizes)} samples per test problem, talkmesh.samples={self.samples}")
        for f in (self.findings.rules if self.findings else []):
            if f.agents not in sizes:
                raise ValueError(f"talkmesh.findings.rules[{f.name!r}].agents={f.agents} is not an evaluated mesh "
                                 f"size {sizes}")
            if f.k > self.samples:
                raise ValueError(f"talkmesh.findings.rules[{f.name!r}].k={f.k} exceeds talkmesh.samples={self.samples}")
        return self


class TalkMeshRunConfig(RunConfig):
    """A run config with the ``talkmesh`` section (required)."""

    talkmesh: TalkMeshConfig

    @model_validator(mode="after")
    def _check_talkmesh(self) -> "TalkMeshRunConfig":
        if self.talkmesh.harness not in self.harnesses:
            raise ValueError(f"talkmesh.harness={self.talkmesh.harness!r} is not in harnesses {self.harnesses}")
        if self.talkmesh.findings is not None and not self.split.disjoint:
            raise ValueError("split.disjoint=False: a findings config (talkmesh.findings) needs split.disjoint: true "
                             "(no test problem may be a train problem)")
        return self


def load_talkmesh_config(path: str | Path, overrides: dict[str, Any] | None = None, *,
                         quick: bool = False) -> TalkMeshRunConfig:
    """Load and validate a TalkMesh run config from YAML (``overrides`` and ``quick``, the config's
    own ``quick`` section applied first, as in :func:`tasks.config.load_config`).

    Raises:
        ConfigError: missing file, not YAML, not a mapping, or a validation failure (names the
            file, key path and value).
    """
    return load_config(path, overrides, model=TalkMeshRunConfig, quick=quick)  # type: ignore[return-value]
