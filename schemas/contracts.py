"""The contract of every artifact: a versioned pyarrow schema and its data expectations.

Expectations are declared as small tuples and turned into a Great Expectations 1.x suite by
:mod:`schemas.validation`. Bump ``version`` whenever a schema or an expectation changes: the
version is stored in the Parquet metadata and checked on read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tasks.registries import KL_ESTIMATORS, PLACEMENTS  # pure Python, rank 0 like schemas (no torch)

# An expectation: (kind, column, *args). Kinds: not_null, unique, between(min, max), in_set(values),
# compound_unique(columns...) (the column slot holds a tuple of column names). An in_set's values
# may be a registry (tasks.registries): the names registered when an artifact is checked.
Expectation = tuple[Any, ...]

STATUS_EPISODE = ["ok", "infra_error", "timeout"]
# tasks.rollout.harness.STOP_REASONS (schemas import nothing from tasks above rank 0: tests/test_import_graph.py)
STOP_REASONS = ["infra_error", "timeout", "max_tokens", "format_error", "max_turns", "submitted"]
STATUS_EVAL = ["resolved", "unresolved", "infra_error", "timeout"]
SPLITS = ["train", "test"]


@dataclass(frozen=True)
class Contract:
    """An artifact's contract. ``schema`` is exact: same names, order and types.

    ``older``: schemas of earlier versions that are still read (a column added later: the old
    files stay readable; readers use ``row.get`` for the new columns).

    ``may_be_empty``: whether an artifact with no rows is valid. When it is not, writing one fails
    (:func:`schemas.validation.check_rows`) with ``empty_cause``, the likely cause, in the message:
    a stage whose every row fell out must stop there, not hand the next stage nothing (Great
    Expectations' map expectations all pass on an empty frame). Not part of the stored bytes, so
    it is no schema change (``version`` stays).
    """

    name: str
    version: int
    schema: pa.Schema
    expectations: list[Expectation] = field(default_factory=list)
    description: str = ""
    may_be_empty: bool = True
    empty_cause: str = ""
    # earlier versions still read (version -> its schema; the same expectations): a run written
    # before a column was added stays readable by the code that added it
    older: dict[int, pa.Schema] = field(default_factory=dict)

    def at_version(self, version: int) -> "Contract":
        """This contract as it was at ``version`` (itself, or an :attr:`older` schema).

        Raises:
            KeyError: a version that is neither the current one nor one of :attr:`older`.
        """
        if version == self.version:
            return self
        from dataclasses import replace

        return replace(self, version=version, schema=self.older[version], older={})

    def __post_init__(self) -> None:
        if not self.may_be_empty and not self.empty_cause:
            raise ValueError(f"contract {self.name!r}: may_be_empty=False needs an empty_cause (the likely cause of "
                             "0 rows, shown when it happens)")


def _s(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=True) for n, t in fields])


_HEX = [("not_null",)]

CONTRACTS: dict[str, Contract] = {}


def _register(c: Contract) -> Contract:
    CONTRACTS[c.name] = c
    return c


TASKS = _register(
    Contract(
        "tasks",
        2,
        _s(
            ("task_id", pa.string()),
            ("suite", pa.string()),
            ("split", pa.string()),
            ("instruction", pa.string()),
            ("environment", pa.string()),
            ("workspace", pa.string()),
            ("verifier_kind", pa.string()),
            ("verifier_spec", pa.string()),
            ("metadata", pa.string()),
            ("task_hash", pa.string()),
        ),
        [
            ("not_null", "task_id"),
            ("unique", "task_id"),
            ("unique", "task_hash"),
            ("not_null", "instruction"),
            ("in_set", "split", SPLITS),
            ("in_set", "environment", ["answer", "workspace", "browser"]),
            ("not_null", "workspace"),
            ("not_null", "verifier_spec"),
        ],
        "One row per task. workspace (JSON) is the visible set-up of the work dir. verifier_spec holds the hidden answer/tests; it never enters a prompt.",
        may_be_empty=False,
        empty_cause="no task came out of the configured suites (check suites[].size and each suite's source)",
    )
)

HARNESSES = _register(
    Contract(
        "harnesses",
        1,
        _s(
            ("harness_id", pa.string()),
            ("name", pa.string()),
            ("family", pa.string()),
            ("system_prompt", pa.string()),
            ("instance_template", pa.string()),
            ("tools", pa.string()),
            ("action_format", pa.string()),
            ("loop_type", pa.string()),
            ("max_turns", pa.int32()),
            ("limits", pa.string()),
            ("sampling", pa.string()),
            ("spec_json", pa.string()),
        ),
        [("unique", "harness_id"), ("unique", "name"), ("between", "max_turns", 1, 1000)],
        "One row per harness spec; harness_id = sha256 of the canonical spec JSON.",
        may_be_empty=True,  # never empty in a run (config harnesses has min_length 1); not asked for here
    )
)

RECORDS = _register(
    Contract(
        "records",
        1,
        _s(
            ("record_id", pa.string()),
            ("task_id", pa.string()),
            ("task_hash", pa.string()),
            ("harness_id", pa.string()),
            ("harness_name", pa.string()),
            ("split", pa.string()),
            ("seed", pa.int64()),
        ),
        [("unique", "record_id"), ("in_set", "split", SPLITS), ("not_null", "task_hash")],
        "A frozen task-harness pair; record_id = sha256(task_hash, harness_id, seed).",
        may_be_empty=False,
        empty_cause="no (task, harness) pair: no harness drives the tasks' environments (check harnesses and suites)",
    )
)

SPLIT_OVERLAP = _register(
    Contract(
        "split_overlap",
        1,
        _s(
            ("suite", pa.string()),
            ("n_train", pa.int64()),
            ("n_test", pa.int64()),
            ("test_same_prompt", pa.int64()),
            ("test_same_problem", pa.int64()),
            ("disjoint", pa.bool_()),
        ),
        [("unique", "suite"), ("between", "test_same_prompt", 0, None), ("between", "test_same_problem", 0, None)],
        "Per suite: test tasks whose prompt (whitespace collapsed) or normalised problem (for arithmetic, the "
        "parsed expression) equals a train task's (tasks.records.overlap); disjoint: split.disjoint was set, "
        "and then both counts are 0.",
    )
)

EPISODES = _register(
    Contract(
        "episodes",
        3,
        _s(
            ("episode_id", pa.string()),
            ("record_id", pa.string()),
            ("task_id", pa.string()),
            ("task_hash", pa.string()),
            ("harness_id", pa.string()),
            ("harness_name", pa.string()),
            ("split", pa.string()),
            ("policy_id", pa.string()),
            ("policy_version", pa.int32()),
            ("group_id", pa.string()),
            ("sample_idx", pa.int32()),
            ("seed", pa.int64()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("status", pa.string()),
            ("stop_reason", pa.string()),
            ("num_turns", pa.int32()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("final_answer", pa.string()),
            ("answer_parsed", pa.bool_()),
        ),
        [
            ("unique", "episode_id"),
            ("between", "reward", 0.0, 1.0),
            ("in_set", "status", STATUS_EPISODE),
            ("in_set", "stop_reason", STOP_REASONS),
            ("between", "num_turns", 1, 1000),
            ("not_null", "group_id"),
        ],
        "One rollout. group_id = the sampling group (task, harness); the trainer regroups by rule. stop_reason: why "
        "it ended (tasks.rollout.harness.STOP_REASONS); a turn cut at max_new_tokens has finish_reason 'length'. "
        "answer_parsed: the answer came from the harness's own format (answer pattern or submit tool), not the fallback.",
        may_be_empty=False,
        empty_cause=("no episode was sampled: the frozen records have no train split, or the sampler returned nothing "
                     "(check split.test_fraction and the rollout engine; for online_episodes, the online sampler)"),
    )
)

TURNS = _register(
    Contract(
        "turns",
        2,
        _s(
            ("episode_id", pa.string()),
            ("turn_idx", pa.int32()),
            ("prompt_continues", pa.bool_()),
            ("prompt_added_ids", pa.list_(pa.int32())),
            ("completion_token_ids", pa.list_(pa.int32())),
            ("completion_logprobs", pa.list_(pa.float32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("completion_text", pa.string()),
            ("finish_reason", pa.string()),
            ("action", pa.string()),
            ("observation", pa.string()),
            ("read_spans", pa.string()),
        ),
        [
            ("not_null", "episode_id"),
            ("compound_unique", ("episode_id", "turn_idx")),
            ("in_set", "finish_reason", ["stop", "length"]),
            ("not_null", "prompt_continues"),
        ],
        "One turn. A turn stores the prompt tokens it adds, not its whole prompt: prompt_continues true means "
        "prompt(t) = prompt(t-1) + completion(t-1) + prompt_added_ids (the observation and chat-format tokens); "
        "false means prompt_added_ids is the whole prompt (turn 0, and every turn of a talkmesh episode, where a turn "
        "is one agent's separate message (proposal, hint or revision) with its own prompt and action is {kind, agent, "
        "round, talk_reward, ...} (tasks.talkmesh.episodes); such turns are never chained into one sequence). "
        "tasks.rollout.turns.episode_prompts rebuilds the prompts.",
        may_be_empty=True,  # a runner may record no turns (scripted runners of tests and benchmarks)
    )
)

TRAIN_STEPS = _register(
    Contract(
        "train_steps",
        4,
        _s(
            ("arm", pa.string()),
            ("step", pa.int32()),
            ("epoch", pa.int32()),
            ("ppo_epoch", pa.int32()),
            ("batch_index", pa.int32()),
            ("loss", pa.float64()),
            ("policy_loss", pa.float64()),
            ("kl", pa.float64()),
            ("kl_penalty", pa.float64()),
            ("entropy", pa.float64()),
            ("clip_frac", pa.float64()),
            ("ratio_min", pa.float64()),
            ("ratio_mean", pa.float64()),
            ("ratio_max", pa.float64()),
            ("grad_norm", pa.float64()),
            ("reward_mean", pa.float64()),
            ("zero_adv_frac", pa.float64()),
            ("lr", pa.float64()),
            ("tokens", pa.int64()),
            ("sequences", pa.int64()),
            ("policy_version_sampled", pa.int64()),
            ("staleness", pa.int64()),
            ("logp_mismatch_mean", pa.float64()),
            ("logp_mismatch_max", pa.float64()),
            ("sync_max_abs_logp_diff", pa.float64()),
            ("dropped", pa.string()),
        ),
        [("not_null", "arm"), ("compound_unique", ("arm", "step")), ("between", "clip_frac", 0.0, 1.0),
         ("between", "zero_adv_frac", 0.0, 1.0), ("between", "staleness", 0, 1_000_000),
         ("between", "epoch", 0, 1_000_000), ("between", "batch_index", 0, 1_000_000)],
        "One optimizer step of one training arm ('final' without arms) on one mini-batch of whole groups: epoch = the "
        "pass over the frozen rollouts, or the online sampling iteration; ppo_epoch and batch_index place it in that "
        "batch. kl = token mean of k(theta, ref) on the sequences trained (NaN without a KL term); kl_penalty = mean "
        "beta * sum_t k subtracted from the rewards (NaN unless the KL is in the reward); ratio_* = pi_theta / pi_old "
        "over policy tokens (sequence ratios for GSPO); logp_mismatch_* = |sampler - trainer| log-prob of the batch's "
        "tokens at the sampling version (NaN where the trainer never held that version, or where the step ran no "
        "forward pass: every advantage 0 and no KL term); sync_max_abs_logp_diff = the "
        "weight-sync canary of the weights that sampled the batch (NaN: never synced); dropped = JSON {rule: episodes "
        "left out of the batch}. Wall-clock figures vary run to run, so they live in the manifest (extra.timing, "
        "extra.phases), not in the Parquet, which stays byte-identical for a given config and seed.",
        may_be_empty=False,
        empty_cause=("no optimizer step ran: every arm ended before its first step (check train.epochs / train.steps, "
                     "arms, and the episodes left after train.drop_stop_reasons)"),
    )
)

CHECKPOINTS = _register(
    Contract(
        "checkpoints",
        1,
        _s(
            ("name", pa.string()),
            ("step", pa.int32()),
            ("path", pa.string()),
            ("adapter_sha256", pa.string()),
            ("base_model_id", pa.string()),
        ),
        [("unique", "name")],
        "A policy to evaluate: 'base' (no adapter, empty path and sha) or a saved LoRA adapter.",
        may_be_empty=True,  # never empty from the train stage ('base' or an arm's adapter); not asked for here
    )
)

EVALUATIONS = _register(
    Contract(
        "evaluations",
        3,
        _s(
            ("seq", pa.int64()),
            ("eval_id", pa.string()),
            ("record_id", pa.string()),
            ("task_id", pa.string()),
            ("task_hash", pa.string()),
            ("checkpoint", pa.string()),
            ("adapter_sha256", pa.string()),
            ("harness_id", pa.string()),
            ("harness_name", pa.string()),
            ("attempt", pa.int32()),
            ("seed", pa.int64()),
            ("reward", pa.float64()),
            ("resolved", pa.bool_()),
            ("status", pa.string()),
            ("num_turns", pa.int32()),
            ("output_tokens", pa.int64()),
            ("final_answer", pa.string()),
            ("answer_parsed", pa.bool_()),
            ("retry", pa.int32()),
            ("retry_of", pa.string()),
            ("plan_hash", pa.string()),
            ("prev_hash", pa.string()),
            ("seal_hash", pa.string()),
        ),
        [
            ("unique", "eval_id"),
            ("unique", "seal_hash"),
            ("between", "reward", 0.0, 1.0),
            ("in_set", "status", STATUS_EVAL),
        ],
        "A sealed attempt; seal_hash = sha256(prev_hash, row fields); the first prev_hash is the plan hash. "
        "answer_parsed: the answer was in the harness's own format (not the fallback). "
        "retry > 0: a retry of an infra_error attempt; retry_of = the eval_id of the row it retries (which stays "
        "in the chain); empty for a first attempt.",
        may_be_empty=False,
        empty_cause=("no attempt ran: the sealed plan has no test records or no checkpoints, or the runner returned "
                     "no episodes (check evaluate.harnesses, split.test_fraction and the train stage's checkpoints)"),
    )
)

EVAL_CELLS = _register(
    Contract(
        "eval_cells",
        2,
        _s(
            ("kind", pa.string()),
            ("checkpoint", pa.string()),
            ("train_harnesses", pa.string()),
            ("harness_name", pa.string()),
            ("held_out", pa.bool_()),
            ("n_tasks", pa.int32()),
            ("planned", pa.int64()),
            ("graded", pa.int64()),
            ("infra_errors", pa.int64()),
            ("timeouts", pa.int64()),
            ("graded_fraction", pa.float64()),
            ("counted", pa.bool_()),
            ("k", pa.int32()),
            ("pass_at_1", pa.float64()),
            ("pass_at_k", pa.float64()),
            ("avg_at_k", pa.float64()),
            ("parse_rate", pa.float64()),
            ("acc_given_parsed", pa.float64()),
        ),
        [
            ("in_set", "kind", ["cell", "row_mean", "col_mean"]),
            ("compound_unique", ("kind", "checkpoint", "harness_name")),
            ("between", "graded_fraction", 0.0, 1.0),
        ],
        "The train-harness x eval-harness matrix of a sealed evaluation: one 'cell' row per (checkpoint, "
        "harness) with pass@1, unbiased pass@k and avg@k over graded attempts (infra errors left out of "
        "denominators, counted apart); 'row_mean' rows (harness_name '*') average a checkpoint's counted cells, "
        "'col_mean' rows (checkpoint '*') a harness's. counted = graded_fraction >= evaluate.min_graded_fraction; "
        "metrics of an uncounted cell are null.",
        may_be_empty=False,
        empty_cause=("no (checkpoint, harness) cell: the sealed plan has no checkpoints or no evaluation harnesses "
                     "(check the train stage's checkpoints and evaluate.harnesses)"),
    )
)

# eval_contrasts v1: the columns before training seeds (issue 50)
_CONTRAST_V1 = (
    ("name", pa.string()),
    ("a_checkpoint", pa.string()),
    ("a_harness", pa.string()),
    ("b_checkpoint", pa.string()),
    ("b_harness", pa.string()),
    ("held_out", pa.bool_()),
    ("status", pa.string()),
    ("n_tasks", pa.int32()),
    ("a_mean", pa.float64()),
    ("b_mean", pa.float64()),
    ("estimate", pa.float64()),
    ("ci_low", pa.float64()),
    ("ci_high", pa.float64()),
    ("p_value", pa.float64()),
    ("p_bonferroni", pa.float64()),
    ("alpha", pa.float64()),
    ("m_contrasts", pa.int32()),
    ("sd_diff", pa.float64()),
    ("mdd", pa.float64()),
    ("power", pa.float64()),
    ("resamples", pa.int64()),
    ("seed", pa.int64()),
)

EVAL_CONTRASTS = _register(
    Contract(
        "eval_contrasts",
        2,
        _s(
            *_CONTRAST_V1,
            ("a_seeds", pa.int32()),
            ("b_seeds", pa.int32()),
            ("interval", pa.string()),
        ),
        [("unique", "name"), ("in_set", "status", ["ok", "cell_not_counted", "no_common_tasks"])],
        "A pre-registered contrast a - b of per-task success rates on the tasks both arms graded: task-clustered "
        "paired bootstrap percentile CI at Bonferroni-adjusted level alpha/m, bootstrap p-value (x m, capped at "
        "1), and the minimum detectable difference at the given power (paired normal approximation). v2: a side "
        "naming an arm trained under several seeds is the mean over its seed checkpoints, its interval the "
        "seed-then-task bootstrap (interval 'seed-task', mdd null); a_seeds / b_seeds count each side's training "
        "runs (0: base).",
        older={1: _s(*_CONTRAST_V1)},
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

# eval_findings v1: the columns before training seeds and the control's interval (issue 50)
_FINDINGS_V1 = (
    ("name", pa.string()),
    ("paper", pa.string()),
    ("headline", pa.string()),
    ("measure", pa.string()),
    ("claim", pa.string()),
    ("margin", pa.float64()),
    ("contrast", pa.string()),
    ("control", pa.string()),
    ("estimate", pa.float64()),
    ("ci_low", pa.float64()),
    ("ci_high", pa.float64()),
    ("n", pa.int64()),
    ("control_estimate", pa.float64()),
    ("level", pa.float64()),
    ("seed", pa.int64()),
    ("verdict", pa.string()),
    ("reason", pa.string()),
)

EVAL_FINDINGS = _register(
    Contract(
        "eval_findings",
        2,
        _s(
            *_FINDINGS_V1,
            ("control_ci_low", pa.float64()),
            ("control_ci_high", pa.float64()),
            ("seeds", pa.string()),
            ("single_seed", pa.bool_()),
            ("interval", pa.string()),
        ),
        [("unique", "name"), ("in_set", "verdict", ["reproduced", "not reproduced", "inconclusive"])],
        "The papers' headlines this run tests (evaluate.findings, sealed in the plan): the measure's estimate "
        "and interval at `level`, n tasks, the random-reward control's estimate where one is named, and the "
        "verdict by the pre-registered rule (tasks.evaluate.findings.verdict, docs/experiments/findings-rules.md). "
        "v2 (verdict rule 2): the control's interval; seeds, a JSON object of each trained arm the finding covers "
        "and its training seeds; single_seed, a recipe comparison (two or more trained arms) with an arm of one "
        "seed, which the rule never calls reproduced; interval, how the interval was drawn (task, seed-task, "
        "cell).",
        older={1: _s(*_FINDINGS_V1)},
    )
)

MISMATCH = _register(
    Contract(
        "mismatch",
        3,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("n_tasks", pa.int32()),
            ("attempts", pa.int32()),
            ("graded", pa.int64()),
            ("infra_errors", pa.int64()),
            ("pass_at_1", pa.float64()),
            ("ceiling_k", pa.int32()),
            ("ceiling_tasks", pa.int32()),
            ("ceiling", pa.float64()),
            ("ref_pass_at_1", pa.float64()),
            ("kl_beta", pa.float64()),
            ("ceiling_kl_soft", pa.float64()),
            ("mismatch", pa.float64()),
            ("mismatch_kl_soft", pa.float64()),
            ("mismatch_step", pa.float64()),
            ("predicted_return", pa.float64()),
        ),
        [
            ("between", "pass_at_1", 0.0, 1.0),
            ("between", "ceiling", 0.0, 1.0),
            ("between", "ceiling_kl_soft", 0.0, 1.0),
            ("between", "mismatch", -1.0, 1.0),
            ("between", "mismatch_kl_soft", -1.0, 1.0),
            ("compound_unique", ("checkpoint", "harness_name")),
        ],
        "P1 per checkpoint and evaluation harness: ceiling C = pass@K (unbiased), the KL-soft ceiling "
        "ceiling_kl_soft = mean over tasks of J(p_x) = p_x e^(1/b) / (1 - p_x + p_x e^(1/b)) with p_x the reference "
        "checkpoint's pass rate on task x and b = kl_beta (per task, then averaged; ref_pass_at_1 is the mean of "
        "p_x), mismatch = C - pass@1, mismatch_kl_soft = "
        "C_soft - pass@1 (negative when the policy beats the soft ceiling), mismatch_step = the per-step estimate "
        "by branching (null where not computed) and predicted_return = C - mismatch_step.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

PREDICTORS = _register(
    Contract(
        "predictors",
        2,
        _s(
            ("target", pa.string()),
            ("predictor", pa.string()),
            ("r2", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("n_points", pa.int32()),
            ("slope", pa.float64()),
            ("intercept", pa.float64()),
            ("na_reason", pa.string()),
            ("predictor_bootstrapped", pa.bool_()),
            ("resamples", pa.int64()),
            ("resamples_valid", pa.int64()),
            ("seed", pa.int64()),
            ("level", pa.float64()),
        ),
        [("compound_unique", ("target", "predictor")), ("between", "r2", 0.0, 1.0), ("not_null", "na_reason")],
        "P1's claim test: R^2 of a one-predictor OLS fit (C, C_kl_soft, M, M_step, C - M, C - M_step of the reference "
        "checkpoint under a harness) of the RL gain and of the trained return over (trained checkpoint, harness) "
        "points, with task-clustered bootstrap percentile intervals at level. r2, slope, intercept and the interval "
        "are null, and na_reason says why, when the statistic is undefined or degenerate: fewer than 5 points, a "
        "constant predictor or target, M_step not measured; na_reason is '' when r2 is reported. "
        "predictor_bootstrapped = False for M_step (fixed: its interval resamples the target only).",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

P1_POINTS = _register(
    Contract(
        "p1_points",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("reference", pa.string()),
            ("ref_pass_at_1", pa.float64()),
            ("C", pa.float64()),
            ("C_kl_soft", pa.float64()),
            ("M", pa.float64()),
            ("M_step", pa.float64()),
            ("C_minus_M", pa.float64()),
            ("C_minus_M_step", pa.float64()),
            ("gain", pa.float64()),
            ("trained_return", pa.float64()),
        ),
        [("compound_unique", ("checkpoint", "harness_name")), ("between", "C", 0.0, 1.0),
         ("between", "C_kl_soft", 0.0, 1.0), ("between", "trained_return", 0.0, 1.0), ("between", "gain", -1.0, 1.0)],
        "The points of P1's claim test, one per (trained checkpoint, harness): the predictors measured on the "
        "reference checkpoint (the base policy) under the harness (C = pass@K ceiling, C_kl_soft = KL-soft ceiling "
        "per task then averaged, M = C - pass@1, M_step = per-step mismatch by branching, C_minus_M, C_minus_M_step) "
        "and the targets of the checkpoint (gain = its pass@1 minus the reference's, trained_return = its pass@1); "
        "null where not measured.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

STEP_MISMATCH = _register(
    Contract(
        "step_mismatch",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("episode_id", pa.string()),
            ("harness_name", pa.string()),
            ("task_id", pa.string()),
            ("turn_idx", pa.int32()),
            ("num_turns", pa.int32()),
            ("recorded_success", pa.bool_()),
            ("n", pa.int32()),
            ("k", pa.int32()),
            ("n_infra", pa.int32()),
            ("successes", pa.int32()),
            ("v_star", pa.float64()),
            ("v_pi", pa.float64()),
            ("step_mismatch", pa.float64()),
            ("replay_ok", pa.bool_()),
            ("n_diverged", pa.int32()),
        ),
        [("compound_unique", ("checkpoint", "episode_id", "turn_idx")), ("between", "v_star", 0.0, 1.0),
         ("between", "v_pi", 0.0, 1.0), ("between", "step_mismatch", -1.0, 1.0)],
        "P1's per-step mismatch: continuations branched from the state before each turn of a sealed attempt "
        "(recorded turns replayed, then sampled); n graded continuations (n_infra infra errors left out), v_star = "
        "pass@K of them (V*_K, K = analyze.branching.k; null when n < K), v_pi their mean success, step_mismatch = "
        "V*_K(s_t) - V*_K(s_t+1) with V*_K(s_T) the attempt's recorded success; replay_ok False when a replay "
        "diverged from the recorded prompts (n_diverged continuations).",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

LOG_ODDS_PAIRS = _register(
    Contract(
        "log_odds_pairs",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("task_id", pa.string()),
            ("state_id", pa.string()),
            ("a_episode", pa.string()),
            ("b_episode", pa.string()),
            ("logodds_policy", pa.float64()),
            ("logodds_ref", pa.float64()),
            ("logodds_shift", pa.float64()),
            ("reward_diff", pa.float64()),
        ),
        [("not_null", "logodds_policy"), ("not_null", "logodds_ref")],
        "P1's log-odds check: for a pair (a, b) of the actions sampled at a first-turn state, log pi(a|s) - log pi(b|s) "
        "under the trained checkpoint and under the reference (nats), their difference, and r_a - r_b.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

LOG_ODDS = _register(
    Contract(
        "log_odds",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("n_states", pa.int32()),
            ("n_pairs", pa.int32()),
            ("pearson_policy_ref", pa.float64()),
            ("spearman_policy_ref", pa.float64()),
            ("pearson_shift_reward", pa.float64()),
            ("mean_abs_shift", pa.float64()),
        ),
        [("compound_unique", ("checkpoint", "harness_name")), ("between", "pearson_policy_ref", -1.0, 1.0)],
        "Per checkpoint and harness: correlation of the policy's and the reference's log-odds (Pearson, Spearman) and "
        "of the log-odds shift with the reward difference; null with < 3 pairs or zero variance; mean |shift| in nats.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

LEAKAGE = _register(
    Contract(
        "leakage",
        1,
        _s(
            ("rule", pa.string()),
            ("n_groups", pa.int64()),
            ("zero_groups", pa.int64()),
            ("zero_group_fraction", pa.float64()),
            ("zero_sample_fraction", pa.float64()),
            ("n_samples", pa.int64()),
            ("n_classes", pa.int32()),
            ("chance", pa.float64()),
            ("accuracy", pa.float64()),
            ("null_mean", pa.float64()),
            ("null_sd", pa.float64()),
            ("leakage_pp", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("p_value", pa.float64()),
            ("folds", pa.int32()),
            ("permutations", pa.int32()),
            ("note", pa.string()),
        ),
        [("unique", "rule"), ("between", "zero_group_fraction", 0.0, 1.0), ("between", "accuracy", 0.0, 1.0)],
        "P4 per grouping rule over the training rollouts: groups whose advantages are all zero, and harness-identity "
        "leakage = cross-validated accuracy of a logistic regression predicting the harness from the advantage minus "
        "the shuffled-label null mean, in percentage points, interval from the null's quantiles; note says why a "
        "figure is null.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

ACTION_JSD = _register(
    Contract(
        "action_jsd",
        1,
        _s(
            ("scope", pa.string()),
            ("checkpoint_a", pa.string()),
            ("harness_a", pa.string()),
            ("checkpoint_b", pa.string()),
            ("harness_b", pa.string()),
            ("jsd_bits", pa.float64()),
            ("n_a", pa.int64()),
            ("n_b", pa.int64()),
        ),
        [("in_set", "scope", ["between_harnesses", "between_checkpoints"]), ("between", "jsd_bits", 0.0, 1.0)],
        "P4: Jensen-Shannon divergence (bits) of action-kind distributions of the sealed attempts' turns, between "
        "harnesses within a checkpoint and between checkpoints within a harness; n_a, n_b = turns.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

SUITE_PASS_RATES = _register(
    Contract(
        "suite_pass_rates",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("suite", pa.string()),
            ("n_tasks", pa.int32()),
            ("graded", pa.int64()),
            ("pass_at_1", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("median_turns", pa.float64()),
        ),
        [("compound_unique", ("checkpoint", "harness_name", "suite")), ("between", "pass_at_1", 0.0, 1.0)],
        "Sealed pass@1 per checkpoint, harness and suite (in-domain vs out-of-domain) with a task-resampling "
        "bootstrap interval, and the median agent steps (turns) per graded attempt.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

LEARNING_CURVE = _register(
    Contract(
        "learning_curve",
        1,
        _s(
            ("arm", pa.string()),
            ("checkpoint", pa.string()),
            ("step", pa.int32()),
            ("harness_name", pa.string()),
            ("n_tasks", pa.int32()),
            ("pass_at_1", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("train_reward", pa.float64()),
        ),
        [("compound_unique", ("arm", "checkpoint", "harness_name")), ("between", "pass_at_1", 0.0, 1.0)],
        "Sealed pass@1 against the training step per arm and evaluation harness: base (step 0), the arm's "
        "snapshots (train.save_every) and its final adapter, with a task-resampling bootstrap interval, beside the "
        "mean training reward of the optimizer steps since the previous point (tasks.analysis.learning).",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

TRAINING_STABILITY = _register(
    Contract(
        "training_stability",
        2,
        _s(
            ("arm", pa.string()),
            ("steps", pa.int32()),
            ("first_reward", pa.float64()),
            ("final_reward", pa.float64()),
            ("final_kl", pa.float64()),
            ("max_kl", pa.float64()),
            ("nonfinite_steps", pa.int32()),
            ("early_reward", pa.float64()),
            ("late_reward", pa.float64()),
            ("early_grad_norm", pa.float64()),
            ("max_grad_norm", pa.float64()),
            ("stable", pa.bool_()),
            ("reason", pa.string()),
        ),
        [("unique", "arm")],
        "Per training arm: first and last mean reward, last and largest per-token KL (nats), steps with a NaN/inf "
        "loss or gradient norm or an infinite KL (a NaN KL means no KL term), the mean reward of the first and "
        "last analyze.stability.window steps, the early median and the largest gradient norm, and stable = "
        "finite, KL <= analyze.divergence_kl, and (with analyze.stability) no reward collapse and no gradient "
        "norm out of its band (reason otherwise).",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)

KL_CHECK = _register(
    Contract(
        "kl_check",
        1,
        _s(
            ("configuration", pa.string()),
            ("estimator", pa.string()),
            ("placement", pa.string()),
            ("sampling", pa.string()),
            ("vocab", pa.int64()),
            ("length", pa.int64()),
            ("kl", pa.float64()),
            ("grad_kl_norm", pa.float64()),
            ("expected_grad_norm", pa.float64()),
            ("bias_norm", pa.float64()),
            ("relative_bias", pa.float64()),
            ("unbiased", pa.bool_()),
            ("token_level_bias_norm", pa.float64()),
            ("token_level_unbiased", pa.bool_()),
            ("mc_samples", pa.int64()),
            ("mc_error_norm", pa.float64()),
            ("mc_se_norm", pa.float64()),
            ("paper_unbiased", pa.bool_()),
            ("agrees_with_paper", pa.bool_()),
        ),
        [("unique", "configuration"), ("in_set", "estimator", KL_ESTIMATORS),
         ("in_set", "placement", PLACEMENTS), ("not_null", "bias_norm")],
        "P5's table by enumeration: each (estimator, placement) configuration's gradient bias.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)


STEP_FAILURES = _register(
    Contract(
        "step_failures",
        1,
        _s(
            ("checkpoint", pa.string()),
            ("harness_name", pa.string()),
            ("graded", pa.int64()),
            ("solved", pa.int64()),
            ("failed", pa.int64()),
            ("median_turns_solved", pa.float64()),
            ("mean_turns_solved", pa.float64()),
            ("median_turns_failed", pa.float64()),
            ("mean_turns_failed", pa.float64()),
            ("failed_timeout", pa.int64()),
            ("failed_max_tokens", pa.int64()),
            ("failed_format_error", pa.int64()),
            ("failed_max_turns", pa.int64()),
            ("failed_submitted", pa.int64()),
            ("format_error_turns", pa.int64()),
            ("format_error_attempts", pa.int64()),
            ("tool_turns", pa.int64()),
            ("tool_error_turns", pa.int64()),
            ("tool_error_attempts", pa.int64()),
            ("truncated_turns", pa.int64()),
            ("unparsed_answers", pa.int64()),
            ("note", pa.string()),
        ),
        [("compound_unique", ("checkpoint", "harness_name")), ("between", "graded", 1, None)],
        "P6: per checkpoint and evaluation harness, over the graded final attempts of the sealed evaluation, the "
        "median and mean agent steps (turns) of the solved and of the failed attempts, how the failed ones ended "
        "(stop reasons rebuilt from the turns: timeout, max_tokens, format_error, max_turns, submitted = a wrong "
        "answer), and turn-level errors: format-error replies, failed tool calls (action.tool_status), replies cut "
        "at max_new_tokens, answers not in the harness's format (tasks.analysis.steps). None with a note where the "
        "data cannot say.",
        may_be_empty=True,  # an analysis table: empty where its analysis has nothing to report
    )
)


# The pipeline's own contracts (those defined above). Stage cache keys hash these only, so a key
# never depends on which other modules (``tasks.bipa``, ...) a process happened to import.
PIPELINE_CONTRACTS: frozenset[str] = frozenset(CONTRACTS)


def register_contract(c: Contract) -> Contract:
    """Register a contract defined outside this module (e.g. ``tasks/bipa/contracts.py``).

    Raises:
        ValueError: another contract with the same name and a different definition exists.
    """
    old = CONTRACTS.get(c.name)
    if old is not None and old != c:
        raise ValueError(f"contract {c.name!r} is already registered with another definition")
    return _register(c)


def get_contract(name: str) -> Contract:
    """The contract named ``name``. Raises KeyError naming the known contracts."""
    try:
        return CONTRACTS[name]
    except KeyError:
        raise KeyError(f"no artifact contract named {name!r}; known: {sorted(CONTRACTS)}") from None
