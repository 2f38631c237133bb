"""Storage of the ``turns`` artifact on a real multi-turn rollout, in the current layout (contract
v2: each turn stores the prompt tokens it adds) and in the layout before it (v1: each turn stores
its whole prompt again), for the same rows.

Runs freeze and the rollout stage of a config (``-c``, ``--quick``, ``--set KEY=VALUE`` as for
``harnessrl run``) into a temporary run folder, then rebuilds every turn's full prompt with
:func:`tasks.rollout.turns.episode_prompts` (exact: ``tests/rollout/test_turns.py`` checks it
against rows the v1 code wrote) and writes those v1-layout rows through the artifact store under
the v1 schema (registered here as ``turns_v1``, same Parquet settings). Prints the token counts and
the file sizes; appends a JSON row to ``benchmarks/results/turn_storage.jsonl``.

Usage: ``.venv/bin/python benchmarks/turn_storage.py -c configs/p6-gspo-small.yaml --quick
--set policy.engine=hf``. ``--smoke``: ``configs/default.yaml`` with the tests' tiny model, 4
arithmetic tasks under ``react-python`` (multi-turn) x 1 sample, seconds.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import report  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", type=Path)
    ap.add_argument("--smoke", action="store_true", help="default config, tiny model, 4 tasks x react-python x 1")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE override (repeatable)")
    args = ap.parse_args(argv)
    if args.config is None and not args.smoke:
        ap.error("-c/--config is required (or --smoke)")
    tiny = None
    if args.smoke:
        from _results import tiny_model

        tiny = tempfile.TemporaryDirectory(prefix="harnessrl-bench-tiny-")
        args.config = args.config or Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
        args.sets = [f"policy.model={tiny_model(Path(tiny.name) / 'tiny')}",
                     "policy.engine=hf", "harnesses=[react-python]", "evaluate.contrasts=null",
                     "suites=[{name: basic_arithmetic, size: 4}]",
                     "rollout.samples_per_task=1", "rollout.task_runner=serial", *args.sets]

    import pyarrow as pa
    import yaml

    from schemas import ArtifactStore
    from schemas.contracts import TURNS, Contract, register_contract
    from tasks.config import load_config
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.stage import run_rollout
    from tasks.rollout.turns import by_episode, episode_prompts

    overrides = {k.strip(): yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
    cfg = load_config(args.config, overrides, quick=args.quick)
    fields = [f for f in TURNS.schema if f.name not in ("prompt_continues", "prompt_added_ids")]
    v1 = register_contract(Contract("turns_v1", 1, pa.schema(
        [fields[0], fields[1], pa.field("prompt_token_ids", pa.list_(pa.int32())), *fields[2:]]),
        [e for e in TURNS.expectations if e[1] != "prompt_continues"], "turns as contract v1 stored them"))
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-turns-") as tmp:
        store = ArtifactStore(Path(tmp) / "run")
        tasks, harnesses, records = freeze_tables(cfg)
        refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
                "records": store.write("freeze", "records", records)}
        t0 = time.perf_counter()
        refs.update(run_rollout(store, cfg, refs))
        t_rollout = time.perf_counter() - t0
        turns = store.rows(refs["turns"])
        old = []
        for ts in by_episode(turns).values():
            for t, p in zip(ts, episode_prompts(ts)):
                row = {k: v for k, v in t.items() if k not in ("prompt_continues", "prompt_added_ids")}
                old.append({**row, "prompt_token_ids": p})
        v1_ref = store.write("bench", "turns_v1", old, contract=v1.name)
        v2_bytes = store.manifest("rollout", "turns")["bytes"]
        v1_bytes = store.manifest("bench", "turns_v1")["bytes"]
    eps = by_episode(turns)
    row = {
        "benchmark": "turn_storage", "host": platform.node(), "config": str(args.config), "quick": args.quick,
        "smoke": args.smoke,
        "overrides": args.sets, "harnesses": cfg.harnesses, "engine": cfg.policy.engine,
        "episodes": len(eps), "turns": len(turns), "max_turns_in_an_episode": max(len(ts) for ts in eps.values()),
        "rollout_s": round(t_rollout, 1),
        "prompt_tokens_stored_v1": sum(len(r["prompt_token_ids"]) for r in old),
        "prompt_tokens_stored_v2": sum(len(t["prompt_added_ids"]) for t in turns),
        "completion_tokens": sum(len(t["completion_token_ids"]) for t in turns),
        "turns_parquet_bytes_v1": v1_bytes, "turns_parquet_bytes_v2": v2_bytes,
        "bytes_ratio_v1_over_v2": round(v1_bytes / v2_bytes, 2), "v1_rows": v1_ref.rows,
    }
    report("turn_storage", row)
    if tiny is not None:
        tiny.cleanup()
    return row


if __name__ == "__main__":
    main()
