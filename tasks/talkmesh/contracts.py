"""Artifact contracts of P3 (TalkMesh), registered with the store's contract registry on import."""

from __future__ import annotations

import pyarrow as pa

from schemas.contracts import Contract, register_contract

METHODS = ["majority", "confidence_weighted"]


def _s(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=True) for n, t in fields])


TALKMESH_MESSAGES = register_contract(Contract(
    "talkmesh_messages", 1,
    _s(("condition", pa.string()), ("problem_id", pa.string()), ("agent", pa.int32()), ("round", pa.int32()),
       ("colluder", pa.bool_()), ("proposal", pa.string()), ("proposal_answer", pa.string()),
       ("confidence", pa.float64()), ("hint_source", pa.int32()), ("hint", pa.string()),
       ("hint_answer", pa.string()), ("hint_confidence", pa.float64()), ("hint_rescored", pa.float64()),
       ("hint_ignored", pa.bool_()), ("revision", pa.string()), ("revision_answer", pa.string()),
       ("revision_confidence", pa.float64()), ("kept", pa.bool_()), ("correct_before", pa.bool_()),
       ("correct_after", pa.bool_())),
    [("compound_unique", ("condition", "problem_id", "agent", "round")), ("not_null", "condition"),
     ("between", "confidence", 0.0, 1.0), ("not_null", "kept"), ("not_null", "correct_before"),
     ("not_null", "correct_after")],
    "P3: one row per (condition, problem, agent, talk round). proposal/confidence: the agent's answer at the "
    "round's start; hint_source -1 when the agent did not receive a hint (confident, or its own source); "
    "hint_confidence: the source's claimed confidence; hint_rescored: the receiver's own-head score of the "
    "hint's answer; kept: revision kept (its confidence beat the proposal's); correct_before/after: graded.",
))

TALKMESH_RESULTS = register_contract(Contract(
    "talkmesh_results", 1,
    _s(("condition", pa.string()), ("problem_id", pa.string()), ("answer", pa.string()), ("correct", pa.bool_()),
       ("outputs_spent", pa.int32()), ("consensus", pa.bool_()), ("consensus_step", pa.int32()),
       ("gossip_steps", pa.int32()), ("proposal_accuracy", pa.float64()), ("final_accuracy", pa.float64())),
    [("compound_unique", ("condition", "problem_id")), ("not_null", "correct"),
     ("between", "proposal_accuracy", 0.0, 1.0), ("between", "final_accuracy", 0.0, 1.0)],
    "P3: the mesh's answer per (condition, problem): plurality of the honest agents' gossip decisions; "
    "consensus_step: first gossip step at which every honest agent decided the same (-1: never); "
    "proposal/final_accuracy: fraction of honest agents correct before the talk rounds and after them.",
))

TALKMESH_CURVES = register_contract(Contract(
    "talkmesh_curves", 1,
    _s(("method", pa.string()), ("k", pa.int32()), ("outputs_spent", pa.float64()), ("accuracy", pa.float64()),
       ("problems", pa.int32())),
    [("compound_unique", ("method", "k")), ("in_set", "method", METHODS), ("between", "accuracy", 0.0, 1.0)],
    "P3 baselines on the test problems: majority vote and confidence-weighted vote over k samples, averaged over "
    "seeded orderings of the samples; outputs_spent = k.",
))

TALKMESH_SUMMARY = register_contract(Contract(
    "talkmesh_summary", 1,
    _s(("condition", pa.string()), ("agents", pa.int32()), ("colluders", pa.int32()), ("defended", pa.bool_()),
       ("talk", pa.string()), ("problems", pa.int32()), ("accuracy", pa.float64()),
       ("outputs_spent", pa.float64()), ("consensus_rate", pa.float64()), ("revisions", pa.int32()),
       ("kept", pa.int32()), ("hints_ignored", pa.int32())),
    [("unique", "condition"), ("between", "accuracy", 0.0, 1.0)],
    "P3: one row per evaluated condition (the mesh's agents voting without talk, majority-agents and "
    "confidence-weighted-agents; the mesh with the base or the trained talk policy; collusion with and without "
    "the defence, and majority vote over the agents' answers under collusion); outputs_spent is the mean per "
    "problem. The paired contrasts between conditions are in the manifest's extra.contrasts.",
))

TALKMESH_CALIBRATION = register_contract(Contract(
    "talkmesh_calibration", 1,
    _s(("split", pa.string()), ("bin", pa.int32()), ("lo", pa.float64()), ("hi", pa.float64()), ("n", pa.int32()),
       ("mean_confidence", pa.float64()), ("accuracy", pa.float64()), ("ece", pa.float64()),
       ("brier", pa.float64())),
    [("compound_unique", ("split", "bin")), ("in_set", "split", ["train", "test"]),
     ("between", "ece", 0.0, 1.0)],
    "P3 confidence head: reliability bins (equal width) of the head on the training rollouts and on the test "
    "samples, with the split's expected calibration error and Brier score repeated on each row.",
))

TALKMESH_TALK_STEPS = register_contract(Contract(
    "talkmesh_talk_sequences", 1,
    _s(("problem_id", pa.string()), ("kind", pa.string()), ("group", pa.string()), ("reward", pa.float64()),
       ("tokens", pa.int32()), ("text", pa.string())),
    [("in_set", "kind", ["hint", "revision"]), ("between", "reward", -1.0, 1.0)],
    "P3 talk-policy GRPO batch: one row per trained sequence. revision: reward 1[revision correct] - "
    "1[proposal correct]; hint: the mean of that over the revisions it caused; group: the advantage group "
    "(problem and kind).",
))

TALKMESH_HEAD = register_contract(Contract(
    "talkmesh_head", 1,
    _s(("harness_id", pa.string()), ("harness_name", pa.string()), ("base_model_id", pa.string()),
       ("weight", pa.list_(pa.float32())), ("bias", pa.float64()), ("mean", pa.list_(pa.float32())),
       ("std", pa.list_(pa.float32())), ("n", pa.int32()), ("positives", pa.int32()), ("l2", pa.float64()),
       ("steps", pa.int32()), ("seed", pa.int64()), ("ece", pa.float64()), ("brier", pa.float64())),
    [("unique", "harness_id"), ("not_null", "bias"), ("between", "ece", 0.0, 1.0)],
    "P3 confidence head of a talkmesh harness, fitted in the rollout stage: c = sigmoid(weight . (h - mean) / std "
    "+ bias) on the base model's final hidden state h [H] of (problem, answer) (tasks.talkmesh.calibration); n "
    "graded train proposals with a parsable answer (positives of them correct), the fit's l2 / L-BFGS steps / "
    "seed, and its ECE and Brier score on those proposals. Its SHA-256 is in the sealed evaluation plan.",
))

TALKMESH_BUDGET = register_contract(Contract(
    "talkmesh_budget", 1,
    _s(("series", pa.string()), ("kind", pa.string()), ("agents", pa.int32()), ("k", pa.int32()),
       ("outputs_spent", pa.float64()), ("accuracy", pa.float64()), ("ci_low", pa.float64()),
       ("ci_high", pa.float64()), ("level", pa.float64()), ("problems", pa.int32())),
    [("compound_unique", ("series", "k")), ("in_set", "kind", ["vote", "mesh"]), ("not_null", "series"),
     ("between", "accuracy", 0.0, 1.0), ("between", "ci_low", 0.0, 1.0), ("between", "ci_high", 0.0, 1.0)],
    "P3 accuracy against outputs spent on the test problems, with percentile problem-bootstrap intervals "
    "(tasks.talkmesh.findings.budget_rows): kind vote: majority / confidence_weighted vote over the first k samples "
    "(outputs_spent = k; agents null); kind mesh: a mesh condition without colluders (outputs_spent: mean per "
    "problem run; its accuracy the mean over problems of the mean over its repeats; k null).",
))

TALKMESH_FINDINGS = register_contract(Contract(
    "talkmesh_findings", 1,
    _s(("name", pa.string()), ("paper", pa.string()), ("headline", pa.string()), ("measure", pa.string()),
       ("claim", pa.string()), ("margin", pa.float64()), ("condition", pa.string()), ("agents", pa.int32()),
       ("k", pa.int32()), ("mesh_accuracy", pa.float64()), ("majority_accuracy", pa.float64()),
       ("estimate", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("level", pa.float64()),
       ("n", pa.int32()), ("seed", pa.int64()), ("verdict", pa.string()), ("reason", pa.string())),
    [("unique", "name"), ("not_null", "verdict"), ("in_set", "verdict", ["reproduced", "not reproduced",
                                                                         "inconclusive"])],
    "P3 pre-registered findings (talkmesh.findings, tasks.talkmesh.findings.finding_table): the mesh of `agents` "
    "agents minus majority vote over k samples, per test problem, averaged; paired problem-bootstrap interval at "
    "`level` (Bonferroni over the run's findings); verdict by the rule of docs/experiments/findings-rules.md. "
    "harnessrl verify recomputes it from the sealed rows (talkmesh_sealed).",
))

TALKMESH_SEALED = register_contract(Contract(
    "talkmesh_sealed", 1,
    _s(("seq", pa.int64()), ("kind", pa.string()), ("condition", pa.string()), ("repeat", pa.int32()),
       ("problem_id", pa.string()), ("sample", pa.int32()), ("answer", pa.string()), ("correct", pa.bool_()),
       ("confidence", pa.float64()), ("outputs_spent", pa.float64()), ("path", pa.string()),
       ("sha256", pa.string()), ("plan_hash", pa.string()), ("prev_hash", pa.string()), ("seal_hash", pa.string())),
    [("unique", "seq"), ("unique", "seal_hash"), ("in_set", "kind", ["proposal", "state", "mesh"]),
     ("not_null", "plan_hash"), ("not_null", "prev_hash")],
    "P3 sealed results (tasks.talkmesh.seal), hash-chained to the plan committed before the first test sample: "
    "kind proposal, one row per (test problem, sample) with the graded answer and the confidence head's score; "
    "kind state, the talk adapter the trained meshes ran with (path, SHA-256 of its files); kind mesh, one row per "
    "(condition, repeat, test problem) with the mesh's answer, grade and outputs spent.",
))
