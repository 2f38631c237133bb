"""The base policy's pass@1 on reasoning-gym task families and difficulty settings, to choose the
tasks a learning run can move: a family the model never solves gives GRPO no signal (every group
all-zero), one it always solves gives none either.

For each (family, difficulty) it freezes ``--tasks`` problems under the ``direct`` harness (answer
read from "Answer: <n>" or the last number), samples ``--samples`` completions per problem with
the rollout engine, and prints pass@1 (mean reward), the share of problems solved at least once
(pass@k), the share of groups with a learning signal (neither all-0 nor all-1), the share of
completions cut at ``max_new_tokens`` and the mean completion length.

    .venv/bin/python benchmarks/task_difficulty.py --engine vllm --tasks 48 --samples 8
    .venv/bin/python benchmarks/task_difficulty.py --smoke      # tiny model, 2 families, seconds

Appends one JSON row to ``benchmarks/results/task_difficulty.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import report  # noqa: E402

FAMILIES = {
    "arith-1d-2t": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "arith-1d-3t": ("basic_arithmetic", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}),
    "arith-2d-2t": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}),
    "chain-sum-1d-2t": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "chain-sum-2d-2t": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}),
    "leg-counting-2": ("leg_counting", {"min_animals": 1, "max_animals": 2}),
    "gcd-2d": ("gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 50}),
    "simple-equations": ("simple_equations", {}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engine", default="vllm", choices=["hf", "vllm"])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: all")
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny model, 2 families x 4 tasks x 2 samples")
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from tasks.config import RunConfig
    from tasks.hashing import seed_from
    from tasks.harnesses.spec import HarnessSpec
    from tasks.records.freeze import freeze_tables
    from _results import tiny_model
    from tasks.rollout.stage import load_policy, run_records

    families = args.family or sorted(FAMILIES)
    tmp = None
    if args.smoke:
        tmp = tempfile.TemporaryDirectory()
        args.model = str(tiny_model(Path(tmp.name) / "tiny"))
        args.engine, args.tasks, args.samples, families = "hf", 4, 2, families[:2]
    def family_cfg(f: str) -> RunConfig:
        return RunConfig.model_validate({
            "name": "task-difficulty", "seed": args.seed,
            "suites": [{"source": "reasoning_gym", "name": FAMILIES[f][0], "params": FAMILIES[f][1], "size": args.tasks,
                        "seed": args.seed}],
            "split": {"test_fraction": 0.5}, "harnesses": ["direct"],
            "policy": {"model": args.model, "engine": args.engine, "batch_size": 256,
                       **({"rollout_dtype": "float32"} if args.smoke else {})},
            "rollout": {"samples_per_task": args.samples, "task_runner": "serial"},
        })

    t0 = time.perf_counter()
    policy = load_policy(family_cfg(families[0]))
    start_s = time.perf_counter() - t0
    table = []
    try:
        print(f"\n{'family':<18} {'problems':>8} {'pass@1':>7} {'pass@k':>7} {'signal':>7} {'cut':>6} {'tokens':>7} {'s':>6}")
        for f in families:
            cfg = family_cfg(f)
            task_rows, harness_rows, records = freeze_tables(cfg)  # both splits: nothing is trained here
            specs = {h["harness_id"]: HarnessSpec.model_validate(json.loads(h["spec_json"])) for h in harness_rows}
            tasks = {t["task_id"]: t for t in task_rows}
            t1 = time.perf_counter()
            eps, turns = run_records(policy, cfg, specs, tasks, records, args.samples, seed_from(args.seed, f), f)
            secs = time.perf_counter() - t1
            by_task: dict[str, list[float]] = {}
            for e in eps:
                by_task.setdefault(e["record"]["task_id"], []).append(e["reward"])
            n = len(eps)
            row = {"family": f, "dataset": FAMILIES[f][0], "params": FAMILIES[f][1], "problems": len(by_task),
                   "pass_at_1": round(sum(e["reward"] for e in eps) / n, 4),
                   "pass_at_k": round(sum(max(v) >= 1.0 for v in by_task.values()) / len(by_task), 4),
                   "signal_groups": round(sum(0 < sum(v) < len(v) for v in by_task.values()) / len(by_task), 4),
                   "cut_frac": round(sum(t["finish_reason"] == "length" for t in turns) / max(len(turns), 1), 4),
                   "mean_tokens": round(sum(len(t["completion_token_ids"]) for t in turns) / max(len(turns), 1), 1),
                   "seconds": round(secs, 1)}
            table.append(row)
            print(f"{f:<18} {row['problems']:>8} {row['pass_at_1']:>7.3f} {row['pass_at_k']:>7.3f} "
                  f"{row['signal_groups']:>7.3f} {row['cut_frac']:>6.3f} {row['mean_tokens']:>7.1f} {secs:>6.1f}")
    finally:
        if hasattr(policy, "close"):
            policy.close()
        if tmp is not None:
            tmp.cleanup()
    print()
    report("task_difficulty", {"model": "tiny (smoke)" if args.smoke else args.model, "engine": args.engine,
                               "tasks_per_family": args.tasks, "samples": args.samples, "engine_start_s": round(start_s, 1),
                               "smoke": args.smoke, "families": table})


if __name__ == "__main__":
    main()
