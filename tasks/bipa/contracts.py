"""Artifact contracts of P2 (BiPA: evaluating skill optimizers), registered with the store's
contract registry on import."""

from __future__ import annotations

import pyarrow as pa

from schemas.contracts import Contract, register_contract

SETS = ["selection", "fresh", "test"]
DECISIONS = ["seed", "accepted", "rejected", "invalid"]


def _s(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=True) for n, t in fields])


BIPA_CANDIDATES = register_contract(Contract(
    "bipa_candidates", 1,
    _s(("candidate_idx", pa.int32()), ("harness_id", pa.string()), ("skill", pa.string()),
       ("skill_sha256", pa.string()), ("parent_idx", pa.int32()), ("parent_sha256", pa.string()),
       ("proposal_seed", pa.int64()), ("selection_scores", pa.string()), ("selection_mean", pa.float64()),
       ("incumbent_mean", pa.float64()), ("decision", pa.string()), ("incumbent_after", pa.int32())),
    [("unique", "candidate_idx"), ("not_null", "skill_sha256"), ("in_set", "decision", DECISIONS),
     ("between", "selection_mean", 0.0, 1.0)],
    "P2: one row per skill candidate (row 0: the hand-written seed). selection_scores: JSON {task_id: mean "
    "reward}; incumbent_mean: the parent's selection mean the rule compared against; parent_idx -1 for the seed.",
))

BIPA_REPLAY = register_contract(Contract(
    "bipa_replay", 1,
    _s(("candidate_idx", pa.int32()), ("parent_idx", pa.int32()), ("score_set", pa.string()),
       ("scores", pa.string()), ("mean", pa.float64()), ("parent_mean", pa.float64()),
       ("accepted_at_selection", pa.bool_()), ("rule_accepts", pa.bool_())),
    [("compound_unique", ("candidate_idx", "score_set")), ("in_set", "score_set", SETS),
     ("between", "mean", 0.0, 1.0)],
    "P2: each scored candidate on each score set (selection, fresh = new seeds on the selection tasks, test = "
    "held-out tasks); rule_accepts = the optimizer's rule applied to (mean, parent_mean) of that set.",
))

BIPA_EFFECT = register_contract(Contract(
    "bipa_effect", 1,
    _s(("score_set", pa.string()), ("n_accepted", pa.int32()), ("still_accepted", pa.int32()),
       ("selection_effect", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
       ("bootstrap", pa.int32()), ("seed", pa.int64())),
    [("unique", "score_set"), ("in_set", "score_set", ["fresh", "test"])],
    "P2: selection effect = mean over accepted candidates of (selection mean - mean on score_set), with a "
    "task-resampling percentile bootstrap interval; still_accepted = accepted candidates the rule accepts again.",
))

BIPA_GRAPH_EDGES = register_contract(Contract(
    "bipa_graph_edges", 1,
    _s(("arm", pa.string()), ("episode_id", pa.string()), ("turn_idx", pa.int32()), ("turn_node", pa.string()),
       ("span_node", pa.string()), ("source", pa.string()), ("span_turn", pa.int32()), ("tokens", pa.int64()),
       ("fetched", pa.bool_())),
    [("compound_unique", ("turn_node", "span_node")), ("not_null", "source")],
    "P2 episode graph: edge (turn, span) when the span was in (or was fetched into, fetched=true) the turn's "
    "context. tokens: the span's token count.",
))

BIPA_GRAPH_METRICS = register_contract(Contract(
    "bipa_graph_metrics", 1,
    _s(("arm", pa.string()), ("score_set", pa.string()), ("episodes", pa.int32()), ("turns", pa.int64()),
       ("episode_skill_coverage", pa.float64()), ("turn_skill_coverage", pa.float64()),
       ("mean_turns_to_first_skill_read", pa.float64()), ("skill_input_tokens_per_episode", pa.float64()),
       ("input_tokens_per_episode", pa.float64()), ("turns_per_episode", pa.float64())),
    [("compound_unique", ("arm", "score_set")), ("between", "episode_skill_coverage", 0.0, 1.0),
     ("between", "turn_skill_coverage", 0.0, 1.0)],
    "P2 episode-graph metrics per arm (seed, learned) and score set.",
))

BIPA_SEALED = register_contract(Contract(
    "bipa_sealed", 1,
    _s(("kind", pa.string()), ("name", pa.string()), ("arm", pa.string()), ("opt_seed", pa.int64()),
       ("round", pa.int32()), ("parent", pa.string()), ("skill", pa.string()), ("skill_sha256", pa.string()),
       ("harness_id", pa.string()), ("score_set", pa.string()), ("task_id", pa.string()), ("sample", pa.int32()),
       ("reward", pa.float64()), ("success", pa.bool_()), ("status", pa.string()), ("input_tokens", pa.int64()),
       ("turns", pa.int32()), ("seq", pa.int64()), ("plan_hash", pa.string()), ("prev_hash", pa.string()),
       ("seal_hash", pa.string())),
    [("unique", "seq"), ("unique", "seal_hash"), ("in_set", "kind", ["candidate", "episode"])],
    "P2 sealed rows (tasks/bipa/sealed_run.py): candidate rows (the seed, the hand-written pool, the placebo, the "
    "rewrites with their text) and one episode row per (set, harness, task, sample), hash-chained to bipa/plan.json.",
))

BIPA_FINDINGS = register_contract(Contract(
    "bipa_findings", 1,
    _s(("name", pa.string()), ("paper", pa.string()), ("headline", pa.string()), ("measure", pa.string()),
       ("arm", pa.string()), ("score_set", pa.string()), ("claim", pa.string()), ("margin", pa.float64()),
       ("estimate", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("level", pa.float64()),
       ("n", pa.int32()), ("n_candidates", pa.int32()), ("optimizer_seeds", pa.int32()), ("learned", pa.string()),
       ("interval", pa.string()), ("control", pa.float64()), ("control_ci_low", pa.float64()),
       ("control_ci_high", pa.float64()), ("seed", pa.int64()), ("rule", pa.int32()), ("verdict", pa.string()),
       ("reason", pa.string())),
    [("unique", "name"), ("not_null", "verdict")],
    "P2 pre-registered findings recomputed from bipa_sealed (tasks/bipa/claims.py); estimate None = n/a (reason).",
))

BIPA_GAINS = register_contract(Contract(
    "bipa_gains", 1,
    _s(("name", pa.string()), ("arm", pa.string()), ("opt_seed", pa.int64()), ("round", pa.int32()),
       ("parent", pa.string()), ("decision", pa.string()), ("gain_selection", pa.float64()),
       ("gain_fresh", pa.float64()), ("gain_test", pa.float64()), ("input_tokens_test", pa.float64()),
       ("turns_test", pa.float64())),
    [("unique", "name")],
    "P2: per scored candidate, its mean gain over its parent on each set and its test input tokens and turns "
    "per episode minus its parent's (descriptive; the placebo's row is the null's figure).",
))
