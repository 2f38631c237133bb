"""Held-out means held out: what a test task shares with the train split, and a split that shares
nothing.

Two tasks are *the same prompt* when their instructions are equal after collapsing whitespace,
and *the same problem* when their normalised problems are equal (:func:`problem_key`): for an
arithmetic family that is the expression, parsed, so ``( -9 / 9 )`` and ``-9 / 9`` are one
problem whatever sentence wraps them. A task hash covers the generator's index, so two draws of
the same problem are two tasks with two hashes, and a split by hash alone can put one in train
and the other in test (learn-arith's 240 draws had 6 of 120 test prompts verbatim in train).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tasks.hashing import sha256_text


def _ws(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def prompt_key(task_row: dict[str, Any]) -> str:
    """The instruction with runs of whitespace collapsed: equal keys are the same prompt."""
    return _ws(task_row["instruction"])


def problem_key(task_row: dict[str, Any]) -> str:
    """The task's normalised problem.

    A task whose metadata carries an ``expression`` (reasoning-gym's arithmetic families:
    ``basic_arithmetic``, ``chain_sum``, ...) is keyed by that expression's Python AST when it
    parses (parentheses that change nothing and spacing vanish), else by the expression without
    whitespace. Any other task is keyed by its instruction, case-folded with whitespace collapsed.
    The suite is part of the key: two suites never share a problem by accident of wording.
    """
    meta = task_row.get("metadata") or "{}"
    meta = json.loads(meta) if isinstance(meta, str) else meta
    expr = meta.get("expression") if isinstance(meta, dict) else None
    if isinstance(expr, str) and expr.strip():
        try:
            body = "expr:" + ast.dump(ast.parse(expr.strip(), mode="eval").body)
        except SyntaxError:
            body = "expr:" + re.sub(r"\s+", "", expr)
    else:
        body = "text:" + _ws(task_row["instruction"]).casefold()
    return f"{task_row['suite']}|{body}"


def overlap_rows(task_rows: list[dict[str, Any]], disjoint: bool) -> list[dict[str, Any]]:
    """Rows of the ``split_overlap`` artifact: per suite, the test tasks that share a prompt or a
    problem with any train task (of any suite).

    ``task_rows``: the ``tasks`` artifact's rows (``suite``, ``split``, ``instruction``,
    ``metadata``). Returns one row per suite in suite order: ``suite``, ``n_train``, ``n_test``,
    ``test_same_prompt`` (test tasks whose prompt equals a train prompt), ``test_same_problem``
    (test tasks whose normalised problem equals a train task's; includes the former),
    ``disjoint`` (the split was asked to share nothing).
    """
    train_prompts = {prompt_key(t) for t in task_rows if t["split"] == "train"}
    train_problems = {problem_key(t) for t in task_rows if t["split"] == "train"}
    out: dict[str, dict[str, Any]] = {}
    for t in task_rows:
        row = out.setdefault(t["suite"], {"suite": t["suite"], "n_train": 0, "n_test": 0, "test_same_prompt": 0,
                                          "test_same_problem": 0, "disjoint": disjoint})
        if t["split"] == "train":
            row["n_train"] += 1
            continue
        row["n_test"] += 1
        row["test_same_prompt"] += prompt_key(t) in train_prompts
        row["test_same_problem"] += problem_key(t) in train_problems
    return list(out.values())


def disjoint_split(task_rows: list[dict[str, Any]], test_fraction: float) -> dict[str, str]:
    """``{task_hash: split}`` such that no test task shares a prompt or a problem with a train task.

    Tasks are joined into clusters (same prompt or same problem, transitively); clusters are
    ordered by the SHA-256 of their smallest problem key and go to ``test`` in that order until
    the test side holds at least ``round(test_fraction * n)`` tasks (at least 1 when there are
    two clusters or more), the rest to ``train``. Like the hash split, the rule reads only content,
    so a task keeps its side whatever order the loader yields it in.

    Raises:
        ValueError: every task is one problem (a single cluster), so no split can hold both sides.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for t in task_rows:
        h = "task:" + t["task_hash"]
        union(h, "prompt:" + prompt_key(t))
        union(h, "problem:" + problem_key(t))
    clusters: dict[str, list[str]] = {}
    keys: dict[str, str] = {}
    for t in sorted(task_rows, key=lambda r: r["task_hash"]):
        root = find("task:" + t["task_hash"])
        clusters.setdefault(root, []).append(t["task_hash"])
        k = problem_key(t)
        keys[root] = min(keys.get(root, k), k)
    if len(clusters) < 2 and len(task_rows) >= 2:
        raise ValueError(f"split.disjoint: all {len(task_rows)} tasks are one problem; no split can share nothing")
    order = sorted(clusters, key=lambda r: sha256_text(keys[r]))
    n_test = max(round(test_fraction * len(task_rows)), 1 if len(order) >= 2 else 0)
    out: dict[str, str] = {}
    taken = 0
    for i, root in enumerate(order):
        side = "test" if taken < n_test and i < len(order) - 1 else "train"
        for h in clusters[root]:
            out[h] = side
        taken += len(clusters[root]) if side == "test" else 0
    return out
