"""P4 (docs/methods/p4-within-cross.md): zero-signal groups, the
harness-identity leakage of the advantages, and the action-distribution divergence between
harnesses and between checkpoints.

Advantages come from :func:`tasks.train.advantages.advantages_for`, grouped as the trainer groups
them (by ``task_id`` and ``harness_id``) over the episodes the trainer trains on: those with
status ``ok`` (:func:`tasks.train.sequences.build_sequences` drops every other status, i.e.
``infra_error`` and ``timeout``). The rewards are the recorded episode rewards; a KL penalty the
trainer may subtract in-reward (``kl.placement`` reward/both) is not applied here.
"""

from __future__ import annotations

import json
import math
import numbers
from itertools import combinations
from typing import Any, Iterable, Sequence

import numpy as np

from tasks.train.advantages import GROUPINGS, advantages_for

EPISODE_COLUMNS = ("task_id", "harness_id", "harness_name", "reward", "status")


def _trained_on(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The episodes the trainer uses (status ``ok``), after checking the columns."""
    for i, e in enumerate(episodes):
        for c in EPISODE_COLUMNS:
            if c not in e:
                raise ValueError(f"episode row {i} has no column {c!r} (needs {list(EPISODE_COLUMNS)})")
    return [e for e in episodes if e["status"] == "ok"]


def _advantages(eps: list[dict[str, Any]], rule: str, scale: str, seed: int) -> tuple[np.ndarray, list[str]]:
    if rule not in GROUPINGS:
        raise ValueError(f"rule {rule!r} is not one of {GROUPINGS}")
    adv, gids = advantages_for([float(e["reward"]) for e in eps], [e["task_id"] for e in eps],
                               [e["harness_id"] for e in eps], rule, scale=scale, seed=seed)
    return adv.numpy().astype(np.float64), gids


def zero_advantage_fractions(episodes: list[dict[str, Any]], rules: Sequence[str] = ("within", "cross"),
                             scale: str = "std", *, seed: int = 0) -> list[dict[str, Any]]:
    """How much of the batch carries no learning signal under each grouping rule (P4: "under
    Within 55% of groups were all-0 or all-1").

    Args:
        episodes: episode rows (contract ``episodes``) with ``task_id, harness_id, harness_name,
            reward, status``; only status ``ok`` is used (what the trainer trains on).
        rules: grouping rules of :data:`tasks.train.advantages.GROUPINGS`.
        scale: ``std`` (GRPO) or ``none`` (Dr. GRPO); it does not change which advantages are 0.
        seed: the subsampling seed of ``cross_coverage_matched`` (unused by the other rules).

    Returns:
        One row per rule: ``rule``, ``n_samples`` (ok episodes), ``n_groups``, ``zero_groups``
        (groups whose advantages are all exactly 0: all rewards equal, a single sample, or under
        ``cross_coverage_matched`` a group dropped whole), ``fraction`` = zero_groups / n_groups,
        ``zero_samples`` (samples with advantage exactly 0) and ``sample_fraction`` =
        zero_samples / n_samples.

    Raises:
        ValueError: a missing column, an unknown rule or scale, or no episode with status ok.
    """
    eps = _trained_on(episodes)
    if not eps:
        raise ValueError("zero_advantage_fractions: no episode with status 'ok' (nothing the trainer would use)")
    rows = []
    for rule in rules:
        adv, gids = _advantages(eps, rule, scale, seed)
        all_zero: dict[str, bool] = {}
        for a, g in zip(adv, gids):
            all_zero[g] = all_zero.get(g, True) and bool(a == 0.0)
        zg = int(sum(all_zero.values()))
        zs = int((adv == 0.0).sum())
        rows.append({"rule": rule, "n_samples": len(eps), "n_groups": len(all_zero), "zero_groups": zg,
                     "fraction": zg / len(all_zero), "zero_samples": zs, "sample_fraction": zs / len(eps)})
    return rows


def harness_leakage(episodes: list[dict[str, Any]], rule: str, *, folds: int = 5, permutations: int = 200,
                    seed: int = 0, level: float = 0.95, scale: str = "std") -> dict[str, Any]:
    """P4's harness-identity leakage: how much better than a shuffled-label null a classifier
    predicts a sample's harness from its advantage alone (paper: +4.48 under Cross, +0.02 under
    Within).

    Features: the sample's advantage under ``rule`` (float64 ``[N, 1]``,
    :func:`tasks.train.advantages.advantages_for`) over ALL status-``ok`` episodes, including
    those in zero-advantage groups (as in the paper: the classifier sees the batch the trainer
    sees). Labels: ``harness_name``. Classifier: scikit-learn ``LogisticRegression()`` (lbfgs,
    L2, C=1), scored by accuracy in ``sklearn.model_selection.permutation_test_score`` (Ojala &
    Garriga 2010, JMLR 11) with ``StratifiedKFold(n_splits=min(folds, smallest class count),
    shuffle=True, random_state=seed)`` and ``random_state=seed`` for the label permutations.

    Under ``within`` every (task, harness) group's advantages sum to 0, so each harness's
    advantages sum to 0 over the batch; k-fold cross-validation then slightly anti-learns (the
    training folds' class means are opposite to the held-out fold's) and the leakage comes out
    a little below 0 (measured: mean -2.8 pp over 8 synthetic batches of 200 samples with success
    rates 80% vs 10%; Cross on the same batches: about +35 pp).

    Returns:
        ``rule``, ``accuracy`` (cross-validated, fraction in [0, 1]), ``null_mean`` and ``null_sd``
        (mean and sd (ddof=0) of the ``permutations`` shuffled-label accuracies, fractions),
        ``leakage_pp`` = 100 * (accuracy - null_mean) in percentage points of accuracy (the unit
        of the paper's +4.48), ``ci_low_pp`` / ``ci_high_pp`` = 100 * (accuracy - q_hi(null)) /
        100 * (accuracy - q_lo(null)) with q the (1 + level)/2 and (1 - level)/2 quantiles of the
        null accuracies, ``p_value`` = (1 + #{null >= accuracy}) / (1 + permutations) (sklearn),
        ``n_samples``, ``n_classes``, ``chance`` (majority-class fraction), ``folds`` (used),
        ``permutations``, ``seed``, ``level``.

    Raises:
        ValueError: fewer than 2 harnesses among the ok episodes, a harness with < 2 ok episodes
            (stratified folds impossible), folds < 2, permutations < 1, level outside (0, 1), an
            unknown rule, or a missing column.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, permutation_test_score

    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an int >= 2, got {folds!r}")
    if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations must be an int >= 1, got {permutations!r}")
    if not (isinstance(level, numbers.Real) and 0.0 < level < 1.0):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    eps = _trained_on(episodes)
    labels = np.array([e["harness_name"] for e in eps], dtype=object)
    classes, counts = np.unique(labels, return_counts=True) if len(eps) else (np.array([]), np.array([]))
    if len(classes) < 2:
        raise ValueError(f"harness_leakage: needs >= 2 harnesses among the status-ok episodes, got "
                         f"{len(classes)} ({sorted(classes.tolist())})")
    if counts.min() < 2:
        few = {str(c): int(n) for c, n in zip(classes, counts) if n < 2}
        raise ValueError(f"harness_leakage: every harness needs >= 2 status-ok episodes for stratified folds, "
                         f"got {few}")
    adv, _ = _advantages(eps, rule, scale, seed)
    x = adv.reshape(-1, 1)
    n_splits = min(folds, int(counts.min()))
    cv = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    score, null, p = permutation_test_score(LogisticRegression(), x, labels, cv=cv, n_permutations=permutations,
                                            random_state=seed, scoring="accuracy")
    null = np.asarray(null, dtype=np.float64)
    tail = (1.0 - level) / 2.0
    q_lo, q_hi = np.quantile(null, [tail, 1.0 - tail])
    return {"rule": rule, "accuracy": float(score), "null_mean": float(null.mean()), "null_sd": float(null.std()),
            "leakage_pp": 100.0 * float(score - null.mean()), "ci_low_pp": 100.0 * float(score - q_hi),
            "ci_high_pp": 100.0 * float(score - q_lo), "p_value": float(p), "n_samples": len(eps),
            "n_classes": len(classes), "chance": float(counts.max() / counts.sum()), "folds": n_splits,
            "permutations": permutations, "seed": seed, "level": level}


def action_kind(action_json: str) -> str:
    """The kind of one turn's action, from the ``turns.action`` column: canonical JSON
    ``{"calls": [{"tool", "impl", "args"}, ...], "answer": str | null, "error": str | null}``
    (:meth:`tasks.harnesses.actions.ParsedReply.to_json`).

    Returns:
        the distinct ``impl`` names of the calls, sorted and joined by ``+`` (e.g. ``python``,
        ``python+shell``) when there is any call (whatever the answer or error);
        ``answer`` when an answer is set (not null) and there is no call;
        ``format_error`` when only an error is set;
        ``none`` otherwise (no call, no answer, no error).

    Raises:
        ValueError: not valid JSON, not an object, ``calls`` not a list, or a call without a
            string ``impl`` (the message quotes the start of the value).
    """
    try:
        a = json.loads(action_json)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"action is not valid JSON: {str(action_json)[:80]!r} ({exc})") from None
    if not isinstance(a, dict) or not isinstance(a.get("calls", []), list):
        raise ValueError(f"action is not an object with a 'calls' list: {str(action_json)[:80]!r}")
    calls = a.get("calls") or []
    if calls:
        impls = [c.get("impl") if isinstance(c, dict) else None for c in calls]
        if not all(isinstance(i, str) and i for i in impls):
            raise ValueError(f"action has a call without a string 'impl': {str(action_json)[:80]!r}")
        return "+".join(sorted(set(impls)))
    if a.get("answer") is not None:
        return "answer"
    if a.get("error") is not None:
        return "format_error"
    return "none"


def action_distributions(turns: Iterable[dict[str, Any]], labels: dict[str, tuple[str, str]]
                         ) -> dict[tuple[str, str], dict[str, int]]:
    """Counts of :func:`action_kind` per (checkpoint, harness).

    Args:
        turns: turn rows with ``episode_id`` and ``action`` (contract ``turns``).
        labels: episode_id -> (checkpoint, harness) for the episodes to count; turns of an
            episode not in ``labels`` are skipped (e.g. training rollouts when comparing
            evaluation episodes).

    Returns:
        {(checkpoint, harness): {kind: number of turns}}, keys sorted (deterministic order).

    Raises:
        ValueError: a turn without ``episode_id`` or ``action``, or a malformed action.
    """
    out: dict[tuple[str, str], dict[str, int]] = {}
    for i, t in enumerate(turns):
        if "episode_id" not in t or "action" not in t:
            raise ValueError(f"turn row {i} needs the columns 'episode_id' and 'action'")
        key = labels.get(t["episode_id"])
        if key is None:
            continue
        kind = action_kind(t["action"])
        d = out.setdefault(tuple(key), {})
        d[kind] = d.get(kind, 0) + 1
    return {k: dict(sorted(out[k].items())) for k in sorted(out)}


def jsd_bits(p: dict[str, float], q: dict[str, float]) -> float:
    """Jensen-Shannon divergence between two discrete distributions, in bits (base-2 logs), in [0, 1]:

        JSD(P, Q) = 1/2 KL(P || M) + 1/2 KL(Q || M),  M = (P + Q) / 2

    (Lin 1991, IEEE Trans. Inf. Theory 37(1)). ``p`` and ``q`` map outcomes to non-negative counts
    or weights and are normalised; outcomes missing from one count as 0. Computed with
    ``scipy.spatial.distance.jensenshannon(base=2)``, which returns the square root (the JS
    distance), squared here; clipped to [0, 1] against rounding.

    Raises:
        ValueError: a negative or non-finite weight, or a distribution with total weight 0.
    """
    from scipy.spatial.distance import jensenshannon

    for name, d in (("p", p), ("q", q)):
        for kname, v in d.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"jsd_bits: {name}[{kname!r}] = {v!r} is not a finite number >= 0")
        if math.fsum(d.values()) <= 0:
            raise ValueError(f"jsd_bits: {name} has total weight 0 ({d!r})")
    support = sorted(set(p) | set(q))
    pv = np.array([p.get(s, 0.0) for s in support], dtype=np.float64)
    qv = np.array([q.get(s, 0.0) for s in support], dtype=np.float64)
    d = float(jensenshannon(pv / pv.sum(), qv / qv.sum(), base=2))
    return min(1.0, max(0.0, d * d))


def jsd_table(dists: dict[tuple[str, str], dict[str, int]]) -> list[dict[str, Any]]:
    """JSD rows (P4: "between harnesses for one checkpoint 0.17-0.35 bit vs <= 0.003 bit between
    recipes within one harness") from :func:`action_distributions` output.

    Rows: for each checkpoint, every pair of its harnesses (``scope="between_harnesses"``), then for
    each harness, every pair of checkpoints (``scope="between_checkpoints"``); pairs in sorted
    order, a < b. Columns: ``scope, checkpoint_a, harness_a, checkpoint_b, harness_b, jsd_bits``
    (:func:`jsd_bits`), ``n_a, n_b`` (turn counts). A cell with no turns has no rows.

    Raises:
        ValueError: see :func:`jsd_bits`.
    """
    live = {k: v for k, v in dists.items() if sum(v.values()) > 0}
    rows = []

    def add(scope: str, a: tuple[str, str], b: tuple[str, str]) -> None:
        rows.append({"scope": scope, "checkpoint_a": a[0], "harness_a": a[1], "checkpoint_b": b[0], "harness_b": b[1],
                     "jsd_bits": jsd_bits(live[a], live[b]), "n_a": int(sum(live[a].values())),
                     "n_b": int(sum(live[b].values()))})

    for ck in sorted({k[0] for k in live}):
        for a, b in combinations(sorted(k for k in live if k[0] == ck), 2):
            add("between_harnesses", a, b)
    for h in sorted({k[1] for k in live}):
        for a, b in combinations(sorted(k for k in live if k[1] == h), 2):
            add("between_checkpoints", a, b)
    return rows
