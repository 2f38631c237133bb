"""The ``evaluate`` section: the sealed evaluation and its pre-registered contrasts."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tasks.config.base import LaterOptions, _Strict


class ContrastArm(_Strict):
    """One side of a pre-registered contrast: a checkpoint name (``base``, ``final`` or an arm's
    name) under an evaluation harness."""

    checkpoint: str = Field(min_length=1)
    harness: str = Field(min_length=1)


class P1Cell(LaterOptions):
    """One cell of P1's predictor test: a checkpoint (or an arm trained under several seeds) under
    an evaluation harness, on the test tasks of ``suite`` only (``suites[].source/name``, e.g.
    ``reasoning_gym/products``; None: every test task), so that a (harness, task family) pair is a
    cell of its own."""

    checkpoint: str = Field(min_length=1)
    harness: str = Field(min_length=1)
    suite: str | None = Field(default=None, min_length=1)
    _later: ClassVar[tuple[str, ...]] = ("suite",)


class ContrastConfig(LaterOptions):
    """A pre-registered contrast ``a - b`` (success rate of arm a minus arm b on the same tasks).
    ``suite``: only the test tasks of this suite (``suites[].name``) count, e.g. an out-of-domain,
    evaluation-only suite; None: every test task both sides graded."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")
    a: ContrastArm
    b: ContrastArm
    suite: str | None = Field(default=None, min_length=1)
    _later: ClassVar[tuple[str, ...]] = ("suite",)


class FindingConfig(LaterOptions):
    """A paper's headline, pre-registered with the rule that decides it (docs/experiments/findings-rules.md).

    ``measure``: ``contrast`` (the pre-registered contrast named ``contrast``: a - b of per-task
    success rates), ``harness_spread_minus_recipe_spread`` (how much more the evaluation harness
    moves pass@1 than the checkpoint does, over ``checkpoints``: None = every evaluated one) or
    ``p1_predictor_gap`` (P1: over the trained ``cells``, each a checkpoint under the harness it
    trained in, R^2 of C - M as a predictor of ``target`` minus the better of R^2(C) and R^2(M),
    with C, M measured on ``base`` under the same harness; a cell naming a ``suite`` counts that
    suite's test tasks only, so one harness on two task families gives two cells).
    ``pooled_contrast``: the mean success rate over the ``a_cells`` minus the mean over the
    ``b_cells``, per task, averaged over the tasks every cell graded (of ``suite`` only, when
    set): e.g. the arms whose KL gradient is unbiased against those whose gradient is biased.
    ``claim``: ``increase`` (the measure is above 0), ``no_increase`` (it is at most ``margin``)
    or ``equivalent`` (it lies within ``[-margin, margin]``).
    ``margin``: the smallest difference of interest (success-rate points, in [0, 1]).
    ``control``: for a learning claim, the contrast that measures the same difference for the
    random-reward control arm (``train.reward_control``); the claim stands only where the
    control's estimate is below the real arm's.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")
    paper: str = Field(min_length=1)
    headline: str = Field(min_length=1)
    measure: Literal["contrast", "harness_spread_minus_recipe_spread", "p1_predictor_gap", "pooled_contrast"]
    claim: Literal["increase", "no_increase", "equivalent"]
    contrast: str | None = None
    control: str | None = None
    checkpoints: list[str] | None = None
    cells: list[P1Cell] | None = None
    target: Literal["gain", "return"] = "gain"
    margin: float = Field(default=0.0, ge=0.0, le=1.0)
    a_cells: list[ContrastArm] | None = None
    b_cells: list[ContrastArm] | None = None
    suite: str | None = Field(default=None, min_length=1)
    _later: ClassVar[tuple[str, ...]] = ("a_cells", "b_cells", "suite")

    @model_validator(mode="after")
    def _check(self) -> "FindingConfig":
        if (self.measure == "contrast") != (self.contrast is not None):
            raise ValueError(f"evaluate.findings[{self.name!r}].contrast={self.contrast!r}: a 'contrast' measure "
                             "names one pre-registered contrast, and only it does")
        if self.checkpoints is not None and self.measure != "harness_spread_minus_recipe_spread":
            raise ValueError(f"evaluate.findings[{self.name!r}].checkpoints applies to the spread measure only")
        if (self.measure == "p1_predictor_gap") != (self.cells is not None):
            raise ValueError(f"evaluate.findings[{self.name!r}].cells: the p1_predictor_gap measure names its "
                             "(trained checkpoint, harness) cells, and only it does")
        pooled = self.measure == "pooled_contrast"
        if pooled != (self.a_cells is not None and self.b_cells is not None) or \
                (not pooled and (self.a_cells is not None or self.b_cells is not None or self.suite is not None)):
            raise ValueError(f"evaluate.findings[{self.name!r}]: a_cells, b_cells (both non-empty) and suite belong to "
                             f"the pooled_contrast measure, and it needs both; measure={self.measure!r}")
        if pooled and (not self.a_cells or not self.b_cells or
                       {(c.checkpoint, c.harness) for c in self.a_cells} & {(c.checkpoint, c.harness) for c in self.b_cells}):
            raise ValueError(f"evaluate.findings[{self.name!r}]: a_cells and b_cells must be non-empty and disjoint")
        if self.claim == "equivalent" and self.margin <= 0:
            raise ValueError(f"evaluate.findings[{self.name!r}].margin={self.margin}: an 'equivalent' claim needs a "
                             "margin > 0 (the largest difference that still counts as none)")
        if self.cells is not None and len(self.cells) < 3:
            raise ValueError(f"evaluate.findings[{self.name!r}].cells: {len(self.cells)} cell(s); an R^2 needs at "
                             "least 3 (P1 asks for 5)")
        return self


class EvaluateConfig(LaterOptions):
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
    ``max_infra_error_fraction``: the findings rule on lost attempts (docs/experiments/findings-rules.md):
    ``harnessrl findings`` refuses to publish a run where any stage (rollout, online training's
    own sampling, the evaluation's final attempts) has more than ``floor(fraction * planned)``
    infra errors; None (unset): the default 0, any infra error refuses
    (:data:`tasks.analysis.infra.DEFAULT_MAX_INFRA_ERROR_FRACTION`). Set, it is sealed in the plan
    and the pre-registration like the findings.
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
    # the papers' headlines this run tests, with their verdict rules (tasks.evaluate.findings);
    # sealed in the plan and the pre-registration like the contrasts
    findings: list[FindingConfig] | None = None
    max_infra_error_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    _later: ClassVar[tuple[str, ...]] = ("max_infra_error_fraction",)

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

    @model_validator(mode="after")
    def _findings_name_contrasts(self) -> "EvaluateConfig":
        if self.findings is None:
            return self
        names = [f.name for f in self.findings]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"evaluate.findings must be non-empty with unique names, got {names}")
        known = {c.name for c in self.contrasts or []}
        for f in self.findings:
            for field in ("contrast", "control"):
                ref = getattr(f, field)
                if ref is not None and ref not in known:
                    raise ValueError(f"evaluate.findings[{f.name!r}].{field}={ref!r} is not one of evaluate.contrasts "
                                     f"{sorted(known)}")
        return self
