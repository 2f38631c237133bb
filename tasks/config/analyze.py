"""The ``analyze`` section."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from tasks.config.base import LaterOptions, _Strict


class LeakageConfig(_Strict):
    """P4's harness-identity leakage test: a logistic regression predicting the harness from a
    sample's advantage, ``folds``-fold stratified cross-validation, against ``permutations``
    shuffled-label refits (the null)."""

    folds: int = Field(default=5, ge=2, le=50)
    permutations: int = Field(default=200, ge=10, le=100_000)


class LogOddsConfig(_Strict):
    """P1's log-odds check at first-turn states of the training rollouts: at most
    ``max_states_per_harness`` states (sampling groups) per harness, chosen with the analyze seed;
    0 turns it off."""

    max_states_per_harness: int = Field(default=16, ge=0)
    batch_size: int = Field(default=8, ge=1)


class BranchingConfig(_Strict):
    """P1's per-step mismatch: from every visited state of ``episodes_per_harness`` sealed attempts
    per (checkpoint, harness) of each checkpoint in ``checkpoints``, ``n`` continuations are
    branched and V*_K estimated with pass@``k`` (k <= n). 0 episodes turns it off."""

    episodes_per_harness: int = Field(default=0, ge=0)
    n: int = Field(default=4, ge=1)
    k: int = Field(default=4, ge=1)
    checkpoints: list[str] = Field(default_factory=lambda: ["base"], min_length=1)
    max_depth: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _k_le_n(self) -> "BranchingConfig":
        if self.k > self.n:
            raise ValueError(f"analyze.branching.k={self.k} exceeds analyze.branching.n={self.n}: pass@k needs n >= k "
                             "continuations")
        return self


class StabilityConfig(_Strict):
    """The pre-registered rule that calls a training arm unstable (docs/experiments/findings-rules.md),
    beyond non-finite steps and ``analyze.divergence_kl``: the mean reward over the last
    ``window`` steps below ``reward_collapse`` times the mean over the first ``window`` (the
    reward collapsed), or any step's gradient norm above ``grad_norm_factor`` times the median of
    the first ``window`` steps' (the gradient left its band)."""

    window: int = Field(default=3, ge=1, le=100)
    reward_collapse: float = Field(default=0.5, gt=0.0, lt=1.0)
    grad_norm_factor: float = Field(default=10.0, gt=1.0)


class AnalyzeConfig(LaterOptions):
    """Analysis options (docs/methods/p1-ceiling-mismatch.md, docs/methods/p4-within-cross.md).

    ``ceiling_k``: the K of the pass@K harness ceiling (<= ``evaluate.attempts``). ``kl_beta``: the
    beta b of P1's KL-soft ceiling J(p) = p e^{1/b} / (1 - p + p e^{1/b}), per task then averaged
    (reward units per nat; None: no soft ceiling). Its default 1.0 is chosen for the ceiling (a
    unit reward is worth one nat of divergence from the harness's preferences: each task's odds of
    success times e), not taken from ``train.kl.beta`` (at 0.05, J is ~1 for any task with one
    success); see docs/analyses.md.
    ``reference``: the checkpoint whose pass rate under a harness is the harness's own (the
    predictors and the soft ceiling are taken from it). ``bootstrap_resamples`` and ``seed``: the
    task-clustered bootstrap of the R^2 and pass@1 intervals, and every other random choice of
    the stage. ``divergence_kl``: an arm whose per-token KL (nats) exceeds this at any step, or
    whose loss, KL or gradient norm is not finite, is flagged unstable in the arm summary;
    ``stability`` adds the reward-collapse and gradient-band rules (None: those two are not
    applied).
    ``kl_check``: put P5's estimator table (``harnessrl kl-check``, by enumeration) in the report
    beside each arm's estimator and placement.
    """

    ceiling_k: int = Field(default=4, ge=1)
    kl_beta: float | None = Field(default=1.0, gt=0)
    reference: str = Field(default="base", min_length=1)
    bootstrap_resamples: int = Field(default=2000, ge=100, le=1_000_000)
    seed: int = 0
    leakage: LeakageConfig = Field(default_factory=LeakageConfig)
    log_odds: LogOddsConfig = Field(default_factory=LogOddsConfig)
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    divergence_kl: float = Field(default=1.0, gt=0)
    kl_check: bool = False
    stability: StabilityConfig | None = None
    _later: ClassVar[tuple[str, ...]] = ("stability",)
