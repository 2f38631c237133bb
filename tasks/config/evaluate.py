"""The ``evaluate`` section: the sealed evaluation and its pre-registered contrasts."""

from __future__ import annotations

from pydantic import Field, field_validator

from tasks.config.base import _Strict


class ContrastArm(_Strict):
    """One side of a pre-registered contrast: a checkpoint name (``base``, ``final`` or an arm's
    name) under an evaluation harness."""

    checkpoint: str = Field(min_length=1)
    harness: str = Field(min_length=1)


class ContrastConfig(_Strict):
    """A pre-registered contrast ``a - b`` (success rate of arm a minus arm b on the same tasks)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")
    a: ContrastArm
    b: ContrastArm


class EvaluateConfig(_Strict):
    """Sealed evaluation of the test split: ``attempts`` samples per (record, checkpoint, harness).

    ``harnesses`` (None: the training ``harnesses``) may name harnesses never used in training:
    those are held-out columns (freeze builds their test records only; rollout and training never
    see them). ``contrasts`` are fixed in the plan before any attempt (None: each trained
    checkpoint, ``final`` or every arm, minus ``base`` under each evaluation harness); their
    checkpoints must be ``base`` or an arm name (``final`` without ``arms``). ``min_graded_fraction``: a (checkpoint, harness) cell
    counts only when at least this fraction of its planned attempts were graded (not
    infra_error). ``infra_retries``: times an attempt that ended in infra_error is retried (each
    retry is a new sealed row referring to the original). Statistics: ``alpha`` (family-wise,
    Bonferroni over the contrasts), ``bootstrap_resamples`` task-clustered resamples, ``power``
    for the minimum detectable difference.
    """

    attempts: int = Field(default=4, ge=1)
    harnesses: list[str] | None = None
    seed: int = 1234
    contrasts: list[ContrastConfig] | None = None
    min_graded_fraction: float = Field(default=0.95, gt=0.0, le=1.0)
    infra_retries: int = Field(default=0, ge=0, le=10)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    bootstrap_resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    power: float = Field(default=0.8, gt=0.0, lt=1.0)

    @field_validator("harnesses")
    @classmethod
    def _unique_eval_harnesses(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"evaluate.harnesses must be non-empty without duplicates, got {v}")
        return v

    @field_validator("contrasts")
    @classmethod
    def _unique_contrasts(cls, v: list[ContrastConfig] | None) -> list[ContrastConfig] | None:
        if v is not None:
            names = [c.name for c in v]
            if not v or len(set(names)) != len(names):
                raise ValueError(f"evaluate.contrasts must be non-empty with unique names, got {names}")
        return v
