"""Online GRPO iterations on SmolLM2-135M through the train stage, side by side: sampling with
transformers ``generate`` on a merged copy of the policy (``policy.engine: hf``) against the vLLM
engine with the trainer's weights loaded in place after every batch (``policy.engine: vllm``),
the latter strictly on-policy (``max_staleness`` 0) and one step off-policy (1: the next batch is
generated while the trainer trains).

An iteration = 16 prompts x 8 samples x up to 64 tokens (reasoning-gym arithmetic under the
``direct`` harness), reward, one optimizer step on a LoRA adapter (r 16, all linear layers), KL
off; sampling and training in float32 on every arm (bf16 merged syncs fail the sync canary). The
first iteration of each arm is a warm-up and is not timed. Per arm it prints seconds per iteration
and the phases the train stage records (sample, wait, sync, train), and samples/s.

    .venv/bin/python benchmarks/online_iteration.py [--iters 4]
    .venv/bin/python benchmarks/online_iteration.py --smoke   # the tests' tiny model, hf arm only, seconds

``--smoke`` runs only the ``hf`` arm (each vLLM arm starts an engine, longer than a smoke may);
the row names the skipped arms and leaves the speedups out.

Appends one JSON row to ``benchmarks/results/online_iteration.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import placeholder_episode, report  # noqa: E402

ARMS = [("hf", 0), ("vllm", 0), ("vllm", 1)]


def run_arm(model: str, engine: str, staleness: int, iters: int, prompts: int, group: int, root: Path) -> dict:
    from schemas import ArtifactStore
    from tasks.config import RunConfig
    from tasks.records.freeze import freeze_tables
    from tasks.train.stage import run_train

    cfg = RunConfig.model_validate({
        "name": f"online-{engine}-{staleness}", "seed": 0,
        "suites": [{"source": "reasoning_gym", "name": "basic_arithmetic", "size": 2 * prompts + 8, "seed": 0,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.2}, "harnesses": ["direct"],
        # float32 on every arm, as configs/learn-arith.yaml: merging a small LoRA update into bf16 weights
        # rounds it away, and the sync canary stops the vLLM arm at its second sync (0.53 nats)
        "policy": {"model": model, "engine": engine, "batch_size": prompts * group,
                   "rollout_dtype": "float32", "autocast_dtype": "float32"},
        "rollout": {"samples_per_task": group, "task_runner": "serial"},
        "train": {"mode": "online", "steps": iters + 1, "prompts_per_step": prompts, "max_staleness": staleness,
                  "lr": 1e-5, "micro_batch_size": 32, "kl": {"beta": 0.0},
                  "lora": {"r": 16, "alpha": 32}},
    })
    store = ArtifactStore(root / cfg.name)
    tasks, harnesses, records = freeze_tables(cfg)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    refs["episodes"] = store.write("rollout", "episodes", [placeholder_episode(records)], contract="episodes")
    refs["turns"] = store.write("rollout", "turns", [], contract="turns")
    t0 = time.perf_counter()
    out = run_train(store, cfg, refs)
    total = time.perf_counter() - t0
    phases = store.manifest("train", "train_steps")["extra"]["phases"][1:]  # the first iteration warms up
    steps = store.rows(out["train_steps"])
    per_iter = [p["iter_s"] for p in phases]
    tokens = [sum(e["output_tokens"] for e in b) for b in _batches(store.rows(out["online_episodes"]), prompts * group)]
    return {"engine": engine, "max_staleness": staleness, "s_per_iter": round(statistics.mean(per_iter), 2),
            "sample_s": round(statistics.mean(p["sample_s"] for p in phases), 2),
            "wait_s": round(statistics.mean(p["wait_s"] for p in phases), 2),
            "train_s": round(statistics.mean(p["train_s"] for p in phases), 2),
            "sync_s": round(statistics.mean(p["sync_s"] for p in phases), 2),
            "samples_per_s": round(prompts * group / statistics.mean(per_iter), 2),
            "completion_tokens_per_iter": round(statistics.mean(tokens[1:]), 1) if len(tokens) > 1 else None,
            "sync_max_abs_logp_diff": max((s["sync_max_abs_logp_diff"] for s in steps
                                           if s["sync_max_abs_logp_diff"] == s["sync_max_abs_logp_diff"]), default=None),
            "max_staleness_seen": max(s["staleness"] for s in steps), "run_s": round(total, 1)}


def _batches(rows: list, n: int) -> list:
    return [rows[i:i + n] for i in range(0, len(rows), n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per arm (after one warm-up)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tests' tiny model, 4 prompts x 2 samples, 1 iteration, hf arm only")
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from _results import tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, prompts, group, iters = "smollm2-135m-instruct", 16, 8, args.iters
        if args.smoke:
            model, prompts, group, iters = str(tiny_model(root / "tiny")), 4, 2, 1
        arms = ARMS[:1] if args.smoke else ARMS
        rows = [run_arm(model, engine, s, iters, prompts, group, root) for engine, s in arms]
    print(f"\n{'engine':<6} {'S':>2} {'s/iter':>7} {'sample':>7} {'wait':>6} {'train':>6} {'sync':>6} {'samples/s':>10}")
    for r in rows:
        print(f"{r['engine']:<6} {r['max_staleness']:>2} {r['s_per_iter']:>7.2f} {r['sample_s']:>7.2f} {r['wait_s']:>6.2f} "
              f"{r['train_s']:>6.2f} {r['sync_s']:>6.2f} {r['samples_per_s']:>10.2f}")
    row = {"model": "tiny (smoke)" if args.smoke else model, "prompts": prompts, "group": group, "max_new_tokens": 64,
           "iters_timed": iters, "smoke": args.smoke, "arms": rows}
    if args.smoke:
        row["skipped"] = "the vllm arms (max_staleness 0 and 1): an engine start each"
    else:
        hf, v0, v1 = rows
        row["speedup_vllm_over_hf"] = round(hf["s_per_iter"] / v0["s_per_iter"], 2)
        row["speedup_async_over_sync"] = round(v0["s_per_iter"] / v1["s_per_iter"], 2)
    report("online_iteration", row)


if __name__ == "__main__":
    main()
