"""P3's headline as a pre-registered finding of a TalkMesh run: accuracy against outputs spent with
intervals, the mesh against majority@k, the verdict, and the rows for
``benchmarks/results/findings.jsonl``.

- **Budget curve** (:func:`budget_rows`): majority and confidence-weighted vote over k = 1..K
  samples (x = k outputs) and every mesh condition without colluders (x = its mean outputs spent
  per problem), each accuracy with a percentile problem-bootstrap interval (Efron & Tibshirani
  1993, ch. 13) at level 0.95.
- **Finding** (:func:`finding_table`): per test problem, d = (mesh accuracy, the mean over its
  repeats) - (majority@k accuracy, the mean over the vote's orderings); the estimate is the mean
  of d over problems, the interval a paired problem bootstrap
  (:func:`tasks.evaluate.stats.paired_bootstrap`) at level ``1 - alpha / m`` (Bonferroni over the
  run's m findings), seed ``seed_from(seed, "finding", name)``; the verdict is
  :func:`tasks.evaluate.findings.verdict`, the rule of docs/experiments/findings-rules.md, fixed in
  the config before the run.
- **Sealed**: ``harnessrl talkmesh`` commits and signs its plan before the first test sample and
  hash-chains the proposals and mesh results to it (:mod:`tasks.talkmesh.seal`);
  ``harnessrl verify`` recomputes the findings table from those rows. :func:`published_rows`
  carries the verified signer's fingerprint; a run made before the seal existed gets
  ``sealed: false`` with the reason instead of a borrowed key.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tasks.hashing import seed_from
from tasks.talkmesh import contracts as _contracts  # noqa: F401  (registers the talkmesh_* contracts it reads)

MEASURE = "mesh_minus_majority_at_k"
UNSEALED_REASON = ("the run has no sealed plan and rows (talkmesh/plan.json, talkmesh_sealed: made before harnessrl "
                   "talkmesh sealed its runs): harnessrl verify cannot recompute this row")


def bootstrap_mean(x: Sequence[float], resamples: int, seed: int, level: float = 0.95
                   ) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)`` of ``x`` (float ``[P]``, one value per problem) with a
    percentile bootstrap over problems (:func:`tasks.evaluate.stats.paired_bootstrap` against 0:
    ``resamples`` draws of P indices with replacement, the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles of the resampled means).

    Raises:
        ValueError: empty ``x``, ``resamples`` < 1 or ``level`` outside (0, 1).
    """
    from tasks.evaluate.stats import paired_bootstrap

    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"bootstrap_mean: need a non-empty 1-d array, got shape {a.shape}")
    est, lo, hi, _ = paired_bootstrap(a, np.zeros_like(a), resamples, seed, level)  # mean(a - 0): one sample
    return est, lo, hi


def budget_rows(votes: dict[str, np.ndarray], meshes: dict[str, dict[str, Any]], *, resamples: int, seed: int,
                level: float = 0.95) -> list[dict[str, Any]]:
    """Rows of the ``talkmesh_budget`` table: accuracy against outputs spent, with intervals.

    Args:
        votes: method -> float ``[P, K]``, per problem the vote's accuracy over the first k samples
            at column k - 1 (:func:`tasks.talkmesh.baselines.vote_matrix`).
        meshes: condition -> ``{"agents": N, "per_problem": float [P] accuracy (mean over
            repeats), "outputs_spent": mean outputs per problem run}``.
        resamples, seed, level: of :func:`bootstrap_mean` (each series and k its own seed,
            ``seed_from(seed, series, k)``).

    Returns rows ``{"series", "kind" (vote | mesh), "agents" (None for votes), "k" (None for
    meshes), "outputs_spent", "accuracy", "ci_low", "ci_high", "level", "problems"}``: the votes
    for k = 1..K, then the meshes in the given order.

    Raises:
        ValueError: a series with no problems, or series with different problem counts.
    """
    sizes = {np.asarray(v).shape[0] for v in votes.values()} | {len(m["per_problem"]) for m in meshes.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"budget_rows: every series needs the same non-zero number of problems, got {sorted(sizes)}")
    rows = []
    for method, mat in votes.items():
        mat = np.asarray(mat, dtype=np.float64)
        for k in range(1, mat.shape[1] + 1):
            est, lo, hi = bootstrap_mean(mat[:, k - 1], resamples, seed_from(seed, method, k) % 2**31, level)
            rows.append({"series": method, "kind": "vote", "agents": None, "k": k, "outputs_spent": float(k),
                         "accuracy": est, "ci_low": lo, "ci_high": hi, "level": level, "problems": mat.shape[0]})
    for cond, m in meshes.items():
        est, lo, hi = bootstrap_mean(m["per_problem"], resamples, seed_from(seed, cond, 0) % 2**31, level)
        rows.append({"series": cond, "kind": "mesh", "agents": int(m["agents"]), "k": None,
                     "outputs_spent": float(m["outputs_spent"]), "accuracy": est, "ci_low": lo, "ci_high": hi,
                     "level": level, "problems": len(m["per_problem"])})
    return rows


def equal_budget_rows(meshes: dict[str, dict[str, Any]], majority: np.ndarray, *, resamples: int, seed: int,
                      level: float = 0.95) -> list[dict[str, Any]]:
    """Each mesh against majority vote at its own budget (descriptive, not a finding): k = its mean
    outputs spent per problem, rounded half up and clipped to [1, K].

    Args:
        meshes: as :func:`budget_rows` (condition -> ``agents``, ``per_problem`` float [P],
            ``outputs_spent``).
        majority: float ``[P, K]``, majority vote's per-problem accuracy at column k - 1.
        resamples, seed, level: of :func:`tasks.evaluate.stats.paired_bootstrap` (seed
            ``seed_from(seed, condition)``).

    Returns rows ``{"condition", "agents", "outputs_spent", "k", "mesh_accuracy",
    "majority_accuracy", "difference", "ci_low", "ci_high", "level", "problems"}``
    (difference = mesh - majority@k, mean over problems).

    Raises:
        ValueError: a mesh with another number of problems than ``majority``.
    """
    import math

    from tasks.evaluate.stats import paired_bootstrap

    maj = np.asarray(majority, dtype=np.float64)
    rows = []
    for cond, m in meshes.items():
        a = np.asarray(m["per_problem"], dtype=np.float64)
        if a.shape != (maj.shape[0],):
            raise ValueError(f"equal_budget_rows: {cond} has {a.size} problems, the vote {maj.shape[0]}")
        k = min(max(int(math.floor(float(m["outputs_spent"]) + 0.5)), 1), maj.shape[1])
        est, lo, hi, _ = paired_bootstrap(a, maj[:, k - 1], resamples, seed_from(seed, cond) % 2**31, level)
        rows.append({"condition": cond, "agents": int(m["agents"]), "outputs_spent": float(m["outputs_spent"]), "k": k,
                     "mesh_accuracy": float(a.mean()), "majority_accuracy": float(maj[:, k - 1].mean()),
                     "difference": est, "ci_low": lo, "ci_high": hi, "level": level, "problems": int(a.size)})
    return rows


def finding_table(rules: Sequence[Any], meshes: dict[int, tuple[str, Sequence[float]]], majority: np.ndarray, *,
                  alpha: float, resamples: int, seed: int) -> list[dict[str, Any]]:
    """Rows of the ``talkmesh_findings`` table, one per rule (:class:`tasks.talkmesh.config.MeshFinding`:
    ``name``, ``headline``, ``agents``, ``k``, ``claim``, ``margin``), in rule order.

    Args:
        meshes: agents N -> (condition, float ``[P]`` per-problem accuracy of that mesh).
        majority: float ``[P, K]``, majority vote's per-problem accuracy over the first k samples
            at column k - 1.
        alpha: family-wise; each interval at level ``1 - alpha / len(rules)``.

    Each row: ``name``, ``paper`` (P3), ``headline``, ``measure`` (:data:`MEASURE`), ``claim``,
    ``margin``, ``condition``, ``agents``, ``k``, ``mesh_accuracy``, ``majority_accuracy``,
    ``estimate`` (mean over problems of mesh - majority@k), ``ci_low``, ``ci_high``, ``level``,
    ``n`` (problems), ``seed``, ``verdict``, ``reason`` (:func:`tasks.evaluate.findings.verdict`).

    Raises:
        ValueError: a rule's mesh size missing from ``meshes``, its k outside [1, K], or a mesh
            with another number of problems than ``majority``.
    """
    from tasks.evaluate.findings import verdict
    from tasks.evaluate.stats import paired_bootstrap

    maj = np.asarray(majority, dtype=np.float64)
    level = 1.0 - alpha / max(len(rules), 1)
    out = []
    for f in rules:
        if f.agents not in meshes:
            raise ValueError(f"finding {f.name!r}: no evaluated mesh of {f.agents} agents (have {sorted(meshes)})")
        if not 1 <= f.k <= maj.shape[1]:
            raise ValueError(f"finding {f.name!r}: k={f.k} is outside [1, K={maj.shape[1]}]")
        cond, pp = meshes[f.agents]
        a = np.asarray(pp, dtype=np.float64)
        b = maj[:, f.k - 1]
        if a.shape != b.shape:
            raise ValueError(f"finding {f.name!r}: the mesh has {a.size} problems, the vote {b.size}")
        s = seed_from(seed, "finding", f.name) % 2**31
        est, lo, hi, _ = paired_bootstrap(a, b, resamples, s, level)
        v, why = verdict(f.claim, est, lo, hi, f.margin)
        out.append({"name": f.name, "paper": "P3", "headline": f.headline, "measure": MEASURE, "claim": f.claim,
                    "margin": f.margin, "condition": cond, "agents": f.agents, "k": f.k,
                    "mesh_accuracy": float(a.mean()), "majority_accuracy": float(b.mean()), "estimate": est,
                    "ci_low": lo, "ci_high": hi, "level": level, "n": int(a.size), "seed": s, "verdict": v,
                    "reason": why})
    return out


def published_rows(store: Any, *, config: str, config_hash: str, commit: str, freeze_seconds: float | None = None,
                   key_fingerprint: str | None = None) -> list[dict[str, Any]]:
    """One ``findings.jsonl`` row per finding of a finished ``harnessrl talkmesh`` run.

    The fields of :func:`flows.published_findings.finding_rows` (``paper``, ``name``, ``headline``,
    ``measure``, ``estimate``, ``ci_low``, ``ci_high``, ``level``, ``n``, ``verdict``, ``reason``,
    ``control`` (None: no random-reward control applies), ``config``, ``config_hash``, ``commit``,
    ``key_fingerprint``, ``wall_s``), plus ``sealed``, the compared accuracies, and ``calibration``:
    the confidence head's ECE and Brier score per split (None for a split without answers).
    ``wall_s``: ``freeze_seconds`` (the freeze stage's ``compute_seconds``; None counts 0) plus
    the TalkMesh task's ``total_s`` (seconds); None when the summary has no timing.
    ``key_fingerprint``: the signing key's, once :func:`tasks.talkmesh.seal.verify_talkmesh` has
    verified the run (``sealed`` True); None for a run made before TalkMesh runs were sealed
    (``sealed`` False, with ``sealed_reason`` :data:`UNSEALED_REASON`). The infra-error fields
    of :func:`tasks.analysis.infra.row_fields` (``infra_errors``, ``infra_planned``,
    ``infra_total``, ``infra_threshold``) are those of the run folder's stages: empty per-stage
    maps for a ``harnessrl talkmesh`` run, which has no rollout, train or evaluate stage (no
    sandbox; a failed generation stops the run instead of losing an attempt).

    Raises:
        FileNotFoundError: the run has no ``talkmesh_findings`` table (not run, or the config sets
            no ``talkmesh.findings``).
        ArtifactError: a table differs from its manifest.
    """
    if not store.exists("talkmesh/talkmesh_findings.manifest.json"):
        raise FileNotFoundError(f"{store.url}: no talkmesh/talkmesh_findings table (run `harnessrl talkmesh` with a "
                                "config that sets talkmesh.findings first)")
    timing = store.manifest("talkmesh", "talkmesh_summary").get("extra", {}).get("timing", {})
    wall = timing.get("total_s")
    if wall is not None:
        wall += float(freeze_seconds or 0.0)
    from tasks.analysis.infra import DEFAULT_MAX_INFRA_ERROR_FRACTION, infra_counts, row_fields

    # this application runs no sandbox: every sample is an in-process model call and a failed one
    # stops the run, so no stage of it counts infra errors (its freeze stage has no episodes either)
    infra = row_fields(infra_counts(store), DEFAULT_MAX_INFRA_ERROR_FRACTION)
    calib: dict[str, Any] = {"train": None, "test": None}
    for r in store.rows(("talkmesh", "talkmesh_calibration")):
        calib[r["split"]] = {"ece": r["ece"], "brier": r["brier"]}
    rows = []
    for f in store.rows(("talkmesh", "talkmesh_findings")):
        rows.append({"paper": f["paper"], "name": f["name"], "headline": f["headline"], "measure": f["measure"],
                     "estimate": f["estimate"], "ci_low": f["ci_low"], "ci_high": f["ci_high"], "level": f["level"],
                     "n": f["n"], "verdict": f["verdict"], "reason": f["reason"], "control": None,
                     "mesh_accuracy": f["mesh_accuracy"], "majority_accuracy": f["majority_accuracy"],
                     "calibration": calib, "config": config, "config_hash": config_hash, "commit": commit,
                     "key_fingerprint": key_fingerprint, "sealed": key_fingerprint is not None,
                     **({} if key_fingerprint else {"sealed_reason": UNSEALED_REASON}),
                     "wall_s": None if wall is None else round(wall, 1), **infra})
    return rows


__all__ = ["MEASURE", "UNSEALED_REASON", "bootstrap_mean", "budget_rows", "equal_budget_rows", "finding_table",
           "published_rows"]
