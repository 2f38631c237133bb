"""The ``bipa.findings`` section: P2's sealed, pre-registered measurement (docs/experiments/p2-bipa.md).

It fixes, before any sample: the pool of hand-written skill edits and the placebo edit (texts,
hashed into the sealed plan), the rewrite arm (the policy's own rewrites, ``rewrite_rounds``
rounds under each of ``rewrite_seeds``), and the claims (:class:`BipaRule`) with the family-wise
``alpha`` and the bootstrap's resamples.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MEASURES = ("learned_minus_seed", "selection_effect", "input_tokens", "turns")


class SkillEdit(BaseModel):
    """A hand-written skill text: ``name`` (a candidate's label in the rows) and the full ``text``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    text: str = Field(min_length=8)


class BipaRule(BaseModel):
    """One pre-registered claim.

    ``measure``: ``learned_minus_seed`` (test pass rate, learned skill minus seed skill),
    ``input_tokens`` / ``turns`` (per test episode, learned minus seed), ``selection_effect``
    (accepted candidates' gain at selection minus their gain on ``score_set``, the placebo as the
    control). ``arm``: whose learned skill (``rewrite``: the policy's rewrites, over optimizer
    seeds; ``pool``: the hand-written pool); a selection effect pools the accepted candidates of
    both arms (``arm: all``). ``claim`` and ``margin`` as in docs/experiments/findings-rules.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    headline: str
    measure: Literal["learned_minus_seed", "selection_effect", "input_tokens", "turns"]
    arm: Literal["rewrite", "pool", "all"] = "rewrite"
    score_set: Literal["fresh", "test"] | None = None
    claim: Literal["increase", "no_increase", "equivalent"]
    margin: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _check(self) -> "BipaRule":
        if (self.measure == "selection_effect") != (self.score_set is not None):
            raise ValueError(f"bipa.findings.rules[{self.name!r}]: score_set is set for a selection_effect only "
                             f"(measure={self.measure!r}, score_set={self.score_set!r})")
        if (self.measure == "selection_effect") != (self.arm == "all"):
            raise ValueError(f"bipa.findings.rules[{self.name!r}]: arm 'all' goes with a selection_effect only "
                             f"(measure={self.measure!r}, arm={self.arm!r})")
        if self.claim == "equivalent" and self.margin <= 0:
            raise ValueError(f"bipa.findings.rules[{self.name!r}]: claim equivalent needs margin > 0")
        return self


class BipaFindings(BaseModel):
    """The sealed measurement (module docstring). ``edits``: the hand-written pool (names unique,
    not ``seed``/``placebo``); ``placebo``: a rewording of the seed that keeps its meaning (the
    null); ``rewrite_seeds``: optimizer seeds of the rewrite arm, each ``rewrite_rounds`` rounds
    of propose-score-accept; ``alpha``: family-wise, each interval at ``1 - alpha / len(rules)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edits: list[SkillEdit] = Field(min_length=1)
    placebo: SkillEdit
    rewrite_seeds: list[int] = Field(min_length=1)
    rewrite_rounds: int = Field(default=2, ge=1, le=50)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    bootstrap_resamples: int = Field(default=2000, ge=100, le=1_000_000)
    rules: list[BipaRule] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "BipaFindings":
        names = [e.name for e in self.edits] + [self.placebo.name]
        bad = sorted({n for n in names if names.count(n) > 1 or n == "seed" or n.startswith("rewrite")})
        if bad:
            raise ValueError(f"bipa.findings: edit names {bad} repeat or are reserved (seed, rewrite*)")
        texts = [e.text for e in self.edits] + [self.placebo.text]
        if len(set(texts)) != len(texts):
            raise ValueError("bipa.findings: two edits have the same text")
        if len(set(self.rewrite_seeds)) != len(self.rewrite_seeds):
            raise ValueError(f"bipa.findings.rewrite_seeds={self.rewrite_seeds}: a seed repeats")
        rn = [r.name for r in self.rules]
        if len(set(rn)) != len(rn):
            raise ValueError(f"bipa.findings.rules: names repeat ({rn})")
        return self
