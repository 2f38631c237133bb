"""The base policy's reward per (suite, harness): every shipped harness on every suite it can
drive, the same tasks and seeds for each, through the rollout engine.

This is step 0 of P4's harness matrix: how much of a suite's score the harness alone moves before
any training. It freezes ``--suite`` suites against every shipped harness (freeze pairs a task only
with the harnesses that drive its environment), runs ``--samples`` episodes per record (train and
test split alike: nothing is trained here) and prints mean reward, success rate, infra errors,
mean turns and tokens per (suite, harness), plus the wall time.

    .venv/bin/python benchmarks/base_rewards.py --engine vllm --tasks 6 --samples 2

Appends one JSON row to ``benchmarks/results/base_rewards.jsonl``. ``--smoke``: the tests' tiny model,
the arithmetic suite, 2 tasks x the ``direct`` harness x 1 sample (seconds; the multi-turn harnesses
are skipped here, ``rollout.py --smoke`` and ``turn_storage.py --smoke`` run ``react-python``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import report  # noqa: E402

SUITES = {
    "arithmetic": {"source": "reasoning_gym", "name": "basic_arithmetic",
                   "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    "gsm": {"source": "reasoning_gym", "name": "gsm_symbolic"},
    "humaneval": {"source": "humaneval", "name": "HumanEval"},
    "terminal": {"source": "terminal_bench", "name": "builtin"},
    "miniwob": {"source": "miniwob", "name": "basic"},
}


def main() -> None:
    from tasks.harnesses.spec import shipped_harnesses

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: all")
    ap.add_argument("--harness", action="append", help=f"default: all shipped ({', '.join(shipped_harnesses())})")
    ap.add_argument("--tasks", type=int, default=6, help="tasks per suite")
    ap.add_argument("--samples", type=int, default=2, help="episodes per (task, harness)")
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny model, arithmetic, 2 tasks x direct x 1 sample")
    args = ap.parse_args()
    tiny = None
    if args.smoke:
        import tempfile

        from _results import tiny_model

        tiny = tempfile.TemporaryDirectory(prefix="harnessrl-bench-tiny-")
        args.model = str(tiny_model(Path(tiny.name) / "tiny"))
        args.engine, args.suite, args.harness = "hf", ["arithmetic"], ["direct"]
        args.tasks, args.samples = 2, 1
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from tasks.config import RunConfig
    from tasks.hashing import seed_from
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.fanout import PolicySource
    from tasks.rollout.harness import HarnessSpec  # noqa: F401  (import cost outside the timing)
    from tasks.rollout.runner import run_records

    suites = args.suite or sorted(SUITES)
    harnesses = args.harness or shipped_harnesses()
    cfg = RunConfig.model_validate({
        "name": "base-rewards", "seed": args.seed,
        "suites": [{**SUITES[s], "size": args.tasks, "seed": args.seed} for s in suites],
        "harnesses": harnesses,
        "policy": {"model": args.model, "engine": args.engine,
                   **({"rollout_dtype": "float32"} if args.smoke else {})},  # fp32: bf16 kernels for each new shape cost more than a smoke's whole run on the CPU
        "sandbox": {"backend": args.backend, "wall_s": 10, "parallel": 4},
        "rollout": {"samples_per_task": args.samples, "task_runner": "serial"},
    })
    t0 = time.perf_counter()
    task_rows, harness_rows, records = freeze_tables(cfg)
    freeze_s = time.perf_counter() - t0
    from tasks.harnesses.spec import HarnessSpec as Spec
    import json

    specs = {h["harness_id"]: Spec.model_validate(json.loads(h["spec_json"])) for h in harness_rows}
    tasks = {t["task_id"]: t for t in task_rows}
    t1 = time.perf_counter()
    eps, turns = run_records(PolicySource.of(cfg, None), cfg, specs, tasks, records, args.samples,
                             seed_from(args.seed, "base-rewards"), "base-rewards")
    rollout_s = time.perf_counter() - t1

    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in eps:
        suite = tasks[e["record"]["task_id"]]["suite"]
        cells[(suite, e["record"]["harness_name"])].append(e)
    print(f"\n{'suite':<28} {'harness':<16} {'n':>4} {'reward':>7} {'success':>8} {'infra':>6} {'turns':>6} {'out tok':>8}")
    table = []
    for (suite, h), es in sorted(cells.items()):
        n = len(es)
        row = {"suite": suite, "harness": h, "episodes": n,
               "mean_reward": round(sum(e["reward"] for e in es) / n, 4),
               "success_rate": round(sum(e["success"] for e in es) / n, 4),
               "infra_errors": sum(e["status"] == "infra_error" for e in es),
               "mean_turns": round(sum(e["num_turns"] for e in es) / n, 2),
               "mean_output_tokens": round(sum(e["output_tokens"] for e in es) / n, 1)}
        table.append(row)
        print(f"{suite:<28} {h:<16} {n:>4} {row['mean_reward']:>7.3f} {row['success_rate']:>8.3f} "
              f"{row['infra_errors']:>6} {row['mean_turns']:>6.2f} {row['mean_output_tokens']:>8.1f}")
    print()
    report("base_rewards", {
        "model": "tiny (smoke)" if args.smoke else args.model, "smoke": args.smoke, "engine": args.engine, "backend": args.backend, "tasks_per_suite": args.tasks,
        "samples": args.samples, "harnesses": harnesses,
        **({"skipped": "every harness but direct"} if args.smoke else {}), "tasks_loaded": {s: sum(t["suite"].startswith(SUITES[s]["source"]) and
                                                          (SUITES[s]["source"] != "reasoning_gym" or
                                                           t["suite"].endswith(SUITES[s]["name"]))
                                                          for t in task_rows) for s in suites},
        "episodes": len(eps), "turns": len(turns), "freeze_s": round(freeze_s, 1), "rollout_s": round(rollout_s, 1),
        "cells": table,
    })


if __name__ == "__main__":
    main()
