"""freeze: task suites x harness specs -> content-addressed, split, frozen task-harness records.

Deterministic: the same config gives the same rows in the same order, hence byte-identical
Parquet and the same hashes. Train and test splits are disjoint by task_hash; with
``split.disjoint`` also by prompt and normalised problem (:mod:`tasks.records.overlap`).
"""

from __future__ import annotations

from typing import Any

from tasks.config import RunConfig
from tasks.harnesses.spec import HarnessSpec, load_harness
from tasks.hashing import sha256_json
from tasks.records.overlap import disjoint_split, overlap_rows
from tasks.records.suites import Task, load_suite


def split_by_hash(tasks: list[Task], test_fraction: float) -> dict[str, str]:
    """Assign each task to ``train`` or ``test`` by its hash.

    Tasks are sorted by ``task_hash``; the first ``round(test_fraction * n)`` (at least 1 when
    n >= 2) are ``test``. Returns ``{task_hash: split}``. The rule depends only on content, so a
    task keeps its split whatever order the loader yields it in.
    """
    hashes = sorted({t.task_hash for t in tasks})
    n_test = round(test_fraction * len(hashes))
    if len(hashes) >= 2:
        n_test = min(max(n_test, 1), len(hashes) - 1)
    return {h: ("test" if i < n_test else "train") for i, h in enumerate(hashes)}


def record_id(task_hash: str, harness_id: str, seed: int) -> str:
    """record_id = sha256([task_hash, harness_id, seed]) (docs/design.md, artifacts)."""
    return sha256_json([task_hash, harness_id, seed])


def freeze_tables(cfg: RunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Build the rows of the ``tasks``, ``harnesses`` and ``records`` artifacts.

    Evaluation-only harnesses (:meth:`RunConfig.held_out_harnesses`) are frozen after the
    training harnesses; they get records for test-split tasks only, so rollout and training (which
    take train-split records) never run them.

    Raises:
        ValueError: a suite yields two tasks with the same task_id, or no task at all; with
            ``split.disjoint``, a test task shares its problem with a train task of another suite.
        HarnessError: a harness spec cannot be loaded.
    """
    task_rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for suite_cfg in cfg.suites:
        tasks = load_suite(suite_cfg)
        if not tasks:
            raise ValueError(f"suite {suite_cfg.name!r} yielded no tasks")
        uniq: dict[str, Task] = {}
        for t in tasks:
            uniq.setdefault(t.task_hash, t)  # identical tasks collapse to one
        if suite_cfg.eval_only:  # an out-of-domain suite: evaluated, never trained on
            splits = {h: "test" for h in uniq}
        elif cfg.split.disjoint:  # no test task shares a prompt or a problem with a train task
            splits = disjoint_split([t.to_row("") for t in uniq.values()], cfg.split.test_fraction)
        else:
            splits = split_by_hash(list(uniq.values()), cfg.split.test_fraction)
        for h in sorted(uniq):
            t = uniq[h]
            if t.task_id in seen:
                raise ValueError(f"duplicate task_id {t.task_id!r} across suites")
            seen.add(t.task_id)
            task_rows.append(t.to_row(splits[h]))
    if cfg.split.disjoint:
        leaks = [r for r in overlap_rows(task_rows, True) if r["test_same_problem"]]
        if leaks:  # across suites (an eval_only suite drawing a train problem): no split can fix it
            r = leaks[0]
            raise ValueError(f"split.disjoint: suite {r['suite']!r} has {r['test_same_problem']} test task(s) whose "
                             "problem is also a train task's (of another suite); drop one of the suites or the flag")

    specs: list[HarnessSpec] = [load_harness(name) for name in cfg.harnesses]
    # evaluation-only (held-out) harnesses: their specs are frozen too, their records are test-only
    held_out = [load_harness(name) for name in cfg.held_out_harnesses()]
    harness_rows = [s.to_row() for s in specs + held_out]

    driven = {env for s in specs for env in s.environments}
    orphans = sorted({(t["suite"], t["environment"]) for t in task_rows if t["environment"] not in driven})
    if orphans:
        suite, env = orphans[0]
        raise ValueError(f"suite {suite!r} has {env!r} tasks but none of the harnesses {cfg.harnesses} drives that "
                         "environment (each harness spec lists its environments)")
    # a record pairs a task only with the harnesses that can drive its environment
    record_rows = [
        {
            "record_id": record_id(t["task_hash"], s.harness_id, cfg.seed),
            "task_id": t["task_id"],
            "task_hash": t["task_hash"],
            "harness_id": s.harness_id,
            "harness_name": s.name,
            "split": t["split"],
            "seed": cfg.seed,
        }
        for t in task_rows
        for s in specs
        if t["environment"] in s.environments
    ] + [
        {
            "record_id": record_id(t["task_hash"], s.harness_id, cfg.seed),
            "task_id": t["task_id"],
            "task_hash": t["task_hash"],
            "harness_id": s.harness_id,
            "harness_name": s.name,
            "split": "test",
            "seed": cfg.seed,
        }
        for t in task_rows
        for s in held_out
        if t["split"] == "test" and t["environment"] in s.environments
    ]
    return task_rows, harness_rows, record_rows
