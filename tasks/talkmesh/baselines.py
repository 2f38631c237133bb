"""Sampling baselines of the TalkMesh evaluation: majority vote and confidence-weighted vote over
k samples, k = 1..K, as accuracy against outputs spent (k outputs for k samples); and the paired
contrasts between evaluated conditions on the same problems.

Accuracy at k is averaged over ``resamples`` orderings of each problem's K samples (ordering 0 is
the sampled order, the others are seeded permutations): the first k of an ordering are the k
samples. Votes ignore unparsable answers; ties go to the answer seen first (in that ordering).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from tasks.talkmesh.mesh import weighted_vote


def _check_votes(answers: Sequence[Sequence[str | None]], confidences: Sequence[Sequence[float]],
                 correct: Sequence[dict[str | None, bool]], k_max: int, resamples: int) -> int:
    if not answers:
        raise ValueError("vote_curves: no problems")
    big_k = len(answers[0])
    if any(len(a) != big_k for a in answers) or len(confidences) != len(answers) or \
            any(len(c) != big_k for c in confidences) or len(correct) != len(answers):
        raise ValueError("vote_curves: answers, confidences and correct must all be [P][K] with one K")
    if not 1 <= k_max <= big_k:
        raise ValueError(f"vote_curves: k_max={k_max} is outside [1, K={big_k}]")
    if resamples < 1:
        raise ValueError(f"vote_curves: resamples={resamples} must be >= 1")
    return big_k


def vote_matrix(answers: Sequence[Sequence[str | None]], confidences: Sequence[Sequence[float]],
                correct: Sequence[dict[str | None, bool]], *, k_max: int, resamples: int = 1, seed: int = 0
                ) -> dict[str, Any]:
    """Per problem and k, the vote's accuracy averaged over the orderings (module docstring).

    Arguments as :func:`vote_curves`. Returns ``{method: float64 ndarray [P, k_max]}`` for
    ``method`` in (``majority``, ``confidence_weighted``): entry [p, k-1] is the fraction of the
    ``resamples`` orderings whose first k samples of problem p vote for a correct answer. The
    orderings are the ones :func:`vote_curves` uses (same seed rule), so its accuracy at k is
    the column mean.

    Raises:
        ValueError: as :func:`vote_curves`.
    """
    hits, n_orders = _vote_hits(answers, confidences, correct, k_max, resamples, seed)
    return {m: h / n_orders for m, h in hits.items()}


def _vote_hits(answers: Sequence[Sequence[str | None]], confidences: Sequence[Sequence[float]],
               correct: Sequence[dict[str | None, bool]], k_max: int, resamples: int, seed: int
               ) -> tuple[dict[str, Any], int]:
    """``({method: int64 [P, k_max] orderings voting right}, number of orderings)``."""
    import numpy as np

    big_k = _check_votes(answers, confidences, correct, k_max, resamples)
    rng = random.Random(seed)
    orders = [list(range(big_k))]
    for _ in range(resamples - 1):
        o = list(range(big_k))
        rng.shuffle(o)
        orders.append(o)
    out = {}
    for method in ("majority", "confidence_weighted"):
        m = np.zeros((len(answers), k_max), dtype=np.int64)
        for p in range(len(answers)):
            for k in range(1, k_max + 1):
                hits = 0
                for o in orders:
                    votes = [(answers[p][j], 1.0 if method == "majority" else confidences[p][j]) for j in o[:k]]
                    hits += bool(correct[p].get(weighted_vote(votes), False))
                m[p, k - 1] = hits
        out[method] = m
    return out, len(orders)


def vote_curves(answers: Sequence[Sequence[str | None]], confidences: Sequence[Sequence[float]],
                correct: Sequence[dict[str | None, bool]], *, k_max: int, resamples: int = 1,
                seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"method", "k", "outputs_spent", "accuracy", "problems"}`` for ``method`` in
    (``majority``, ``confidence_weighted``) and k = 1..``k_max``.

    Args:
        answers: ``[P][K]`` parsed answers of each problem's samples (None: unparsable).
        confidences: ``[P][K]`` confidence-head scores of those answers.
        correct: per problem, answer -> graded correct (every answer that occurs; None -> False).
        k_max: largest k (<= K).
        resamples: orderings averaged (>= 1).

    Raises:
        ValueError: ragged or mismatched inputs, ``k_max`` outside [1, K], ``resamples`` < 1.
    """
    hits, n_orders = _vote_hits(answers, confidences, correct, k_max, resamples, seed)
    rows = []
    for method in ("majority", "confidence_weighted"):
        for k in range(1, k_max + 1):
            rows.append({"method": method, "k": k, "outputs_spent": float(k),
                         "accuracy": int(hits[method][:, k - 1].sum()) / (len(answers) * n_orders),
                         "problems": len(answers)})
    return rows


def contrast_pairs(colluders: list[int]) -> list[tuple[str, str]]:
    """The (a, b) condition pairs the report contrasts, a - b: the mesh (base and trained talk)
    against its own agents voting without talk, the trained talk against the base talk, and for
    each m in ``colluders`` the defended mesh against the undefended one and both against majority
    vote under the same colluders."""
    pairs = [("mesh-base", "majority-agents"), ("mesh-base", "confidence-weighted-agents"),
             ("mesh-talk", "majority-agents"), ("mesh-talk", "mesh-base")]
    for m in colluders:
        c = f"collusion-m{m}"
        pairs += [(f"{c}-defended", f"{c}-undefended"), (f"{c}-defended", f"{c}-majority"),
                  (f"{c}-undefended", f"{c}-majority")]
    return pairs


def paired_contrasts(per_problem: dict[str, list[bool]], pairs: list[tuple[str, str]], *, resamples: int,
                     seed: int, level: float = 0.95) -> list[dict[str, Any]]:
    """Accuracy differences between conditions on the same test problems, with a problem-resampling
    paired bootstrap interval (:func:`tasks.evaluate.stats.paired_bootstrap`; Efron & Tibshirani
    1993, ch. 13).

    Args:
        per_problem: condition -> correct (bool) per test problem, every list in one problem order.
        pairs: (a, b) condition pairs; a pair naming a condition not in ``per_problem`` is skipped
            (e.g. the trained talk when ``train_talk`` is off).
        resamples, seed, level: of the bootstrap.

    Returns:
        Rows ``{"a", "b", "problems", "accuracy_a", "accuracy_b", "difference", "ci_low", "ci_high",
        "p_value"}`` (accuracy as a fraction of problems, difference = accuracy_a - accuracy_b).

    Raises:
        ValueError: the two lists of a pair differ in length or are empty.
    """
    import numpy as np

    from tasks.evaluate.stats import paired_bootstrap

    rows = []
    for a, b in pairs:
        if a not in per_problem or b not in per_problem:
            continue
        xa = np.asarray(per_problem[a], dtype=np.float64)
        xb = np.asarray(per_problem[b], dtype=np.float64)
        est, lo, hi, p = paired_bootstrap(xa, xb, resamples, seed, level)
        rows.append({"a": a, "b": b, "problems": int(xa.size), "accuracy_a": float(xa.mean()),
                     "accuracy_b": float(xb.mean()), "difference": est, "ci_low": lo, "ci_high": hi, "p_value": p})
    return rows
