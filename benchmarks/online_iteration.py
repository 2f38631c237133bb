"""Online GRPO iterations on SmolLM2-135M through the train stage, arms side by side in one run.

An iteration = 16 prompts x 8 samples x up to 64 tokens (reasoning-gym arithmetic under the
``direct`` harness), reward, one optimizer step on a LoRA adapter (r 16, all linear layers). The
first iteration of each arm is a warm-up and is not timed. Per arm it prints seconds per iteration
and the phases the train stage records (sample, wait, sync, train), samples/s, bytes per sync and the
trainer's milliseconds per trained token (a KL term also trains the zero-advantage sequences, so
seconds per iteration alone mixes what its reference pass costs with how much more is trained).

Arms (``--arms``, comma-separated names):

- ``hf``: transformers ``generate`` on a merged float32 copy of the policy, rebuilt every iteration
  (``hf-kl``: with the KL term below);
- ``vllm-fp32-merged`` (``-s1``: one step off-policy): the vLLM engine in float32, the trainer's
  merged weights loaded in place after every batch, trainer in float32 (today's findings path;
  merged into bf16 weights, a small update is rounded away and the sync canary stops the run);
- ``vllm-bf16-delta`` (``-s1``): the vLLM engine's base weights in bf16, only the adapter's
  factors synced and applied beside them in float32 (``policy.vllm.lora: delta``), trainer under
  bf16 autocast;
- ``...-kl``: the same with a k3 KL term in the loss (beta 0.05; the reference is the base model,
  the adapter disabled).

    .venv/bin/python benchmarks/online_iteration.py [--iters 3] [--arms vllm-fp32-merged,vllm-bf16-delta]
    .venv/bin/python benchmarks/online_iteration.py --smoke   # the tests' tiny model, hf arms only, seconds

``--smoke`` runs only the ``hf`` and ``hf-kl`` arms (each vLLM arm starts an engine, longer than a
smoke may; the tiny model solves nothing, so only the KL arm trains a token);
the row names the skipped arms and leaves the ratios out.

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

#: arm name -> (engine, max_staleness, rollout dtype, autocast dtype, policy.vllm.lora, KL beta)
ARMS = {
    "hf": ("hf", 0, "float32", "float32", "auto", 0.0),
    "hf-kl": ("hf", 0, "float32", "float32", "auto", 0.05),
    "vllm-fp32-merged": ("vllm", 0, "float32", "float32", "merged", 0.0),
    "vllm-fp32-merged-s1": ("vllm", 1, "float32", "float32", "merged", 0.0),
    "vllm-bf16-delta": ("vllm", 0, "bfloat16", "bfloat16", "delta", 0.0),
    "vllm-bf16-delta-s1": ("vllm", 1, "bfloat16", "bfloat16", "delta", 0.0),
    "vllm-fp32-merged-kl": ("vllm", 0, "float32", "float32", "merged", 0.05),
    "vllm-bf16-delta-kl": ("vllm", 0, "bfloat16", "bfloat16", "delta", 0.05),
}
DEFAULT_ARMS = ["vllm-fp32-merged", "vllm-bf16-delta", "vllm-fp32-merged-kl", "vllm-bf16-delta-kl"]
#: the ratios the row reports: (name, slower arm, faster arm)
RATIOS = [("speedup_bf16_delta_over_fp32_merged", "vllm-fp32-merged", "vllm-bf16-delta"),
          ("kl_cost_fp32_merged", "vllm-fp32-merged-kl", "vllm-fp32-merged"),
          ("kl_cost_bf16_delta", "vllm-bf16-delta-kl", "vllm-bf16-delta"),
          ("speedup_bf16_delta_kl_over_fp32_merged_kl", "vllm-fp32-merged-kl", "vllm-bf16-delta-kl"),
          ("speedup_vllm_over_hf", "hf", "vllm-fp32-merged"),
          ("speedup_async_over_sync", "vllm-bf16-delta", "vllm-bf16-delta-s1")]
#: trainer milliseconds per trained token, with a KL term over without: (name, KL arm, plain arm)
PER_TOKEN_RATIOS = [("kl_cost_per_token_hf", "hf-kl", "hf"),
                    ("kl_cost_per_token_fp32_merged", "vllm-fp32-merged-kl", "vllm-fp32-merged"),
                    ("kl_cost_per_token_bf16_delta", "vllm-bf16-delta-kl", "vllm-bf16-delta")]


def run_arm(model: str, name: str, iters: int, prompts: int, group: int, root: Path) -> dict:
    from schemas import ArtifactStore
    from tasks.config import RunConfig
    from tasks.records.freeze import freeze_tables
    from tasks.train.stage import run_train

    engine, staleness, rollout_dtype, autocast_dtype, lora, beta = ARMS[name]
    cfg = RunConfig.model_validate({
        "name": f"online-{name}", "seed": 0,
        "suites": [{"source": "reasoning_gym", "name": "basic_arithmetic", "size": 2 * prompts + 8, "seed": 0,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.2}, "harnesses": ["direct"],
        "policy": {"model": model, "engine": engine, "batch_size": prompts * group,
                   "rollout_dtype": rollout_dtype, "autocast_dtype": autocast_dtype, "vllm": {"lora": lora}},
        "rollout": {"samples_per_task": group, "task_runner": "serial"},
        "train": {"mode": "online", "steps": iters + 1, "prompts_per_step": prompts, "max_staleness": staleness,
                  "lr": 1e-5, "micro_batch_size": 32,
                  "kl": {"beta": beta, "estimator": "k3", "placement": "loss"},
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
    return {"arm": name, "engine": engine, "max_staleness": staleness, "rollout_dtype": rollout_dtype,
            "autocast_dtype": autocast_dtype, "lora": lora, "kl_beta": beta,
            "s_per_iter": round(statistics.mean(per_iter), 2),
            "sync_bytes": _sync_bytes(phases),
            "sample_s": round(statistics.mean(p["sample_s"] for p in phases), 2),
            "wait_s": round(statistics.mean(p["wait_s"] for p in phases), 2),
            "train_s": round(statistics.mean(p["train_s"] for p in phases), 2),
            "sync_s": round(statistics.mean(p["sync_s"] for p in phases), 2),
            "samples_per_s": round(prompts * group / statistics.mean(per_iter), 2),
            "completion_tokens_per_iter": round(statistics.mean(tokens[1:]), 1) if len(tokens) > 1 else None,
            "sync_max_abs_logp_diff": max((s["sync_max_abs_logp_diff"] for s in steps
                                           if s["sync_max_abs_logp_diff"] == s["sync_max_abs_logp_diff"]), default=None),
            "max_staleness_seen": max(s["staleness"] for s in steps), "run_s": round(total, 1),
            # the sequences a step without a KL term skips (zero advantage: no gradient); with a KL
            # term each of them carries the KL gradient, so it trains on all
            "zero_adv_frac": round(statistics.mean(s["zero_adv_frac"] for s in steps[1:] or steps), 3),
            "train_tokens_per_step": round(statistics.mean(s["tokens"] for s in steps[1:] or steps), 1),
            # the trainer's cost per token it trained on (timed iterations; each is one step here):
            # with a KL term more sequences train, so seconds per iteration alone mixes the two
            # (None where no timed step trained a token: every advantage 0 and no KL term)
            "train_ms_per_token": (round(1000 * sum(p["train_s"] for p in phases) / trained, 3)
                                   if (trained := sum(s["tokens"] for s in steps[1:])) else None),
            # |trainer's old log-prob - the sampler's| per sampled token: how far the engine's policy is
            # from the one being trained (NaN where a step's old log-probs are not the sampler's version)
            "logp_mismatch_mean": _finite_mean(s["logp_mismatch_mean"] for s in steps)}


def _finite_mean(xs) -> float | None:
    xs = [float(x) for x in xs if x == x]
    return round(statistics.mean(xs), 5) if xs else None


def _sync_bytes(phases: list) -> int | None:
    """Bytes sent per weight sync (the last timed iteration's), None for an arm without syncs."""
    sent = [p.get("sync_bytes") for p in phases if p.get("sync_bytes")]
    return int(sent[-1]) if sent else None


def _batches(rows: list, n: int) -> list:
    return [rows[i:i + n] for i in range(0, len(rows), n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per arm (after one warm-up)")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--smoke", action="store_true",
                    help="the tests' tiny model, 4 prompts x 2 samples, 1 iteration, hf arms only")
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from _results import tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, prompts, group, iters = "smollm2-135m-instruct", 16, 8, args.iters
        if args.smoke:
            model, prompts, group, iters = str(tiny_model(root / "tiny")), 4, 2, 1
        names = ["hf", "hf-kl"] if args.smoke else [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in names if a not in ARMS]
        if unknown:
            raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
        rows = [run_arm(model, name, iters, prompts, group, root) for name in names]
    print(f"\n{'arm':<22} {'s/iter':>7} {'sample':>7} {'wait':>6} {'train':>6} {'sync':>6} {'MiB/sync':>9} {'samples/s':>10}")
    for r in rows:
        mib = f"{r['sync_bytes'] / 2**20:.1f}" if r["sync_bytes"] else "n/a"
        print(f"{r['arm']:<22} {r['s_per_iter']:>7.2f} {r['sample_s']:>7.2f} {r['wait_s']:>6.2f} "
              f"{r['train_s']:>6.2f} {r['sync_s']:>6.2f} {mib:>9} {r['samples_per_s']:>10.2f}")
    row = {"model": "tiny (smoke)" if args.smoke else model, "prompts": prompts, "group": group, "max_new_tokens": 64,
           "iters_timed": iters, "smoke": args.smoke, "arms": rows}
    if args.smoke:
        row["skipped"] = "the vllm arms: an engine start each"
    by = {r["arm"]: r for r in rows}
    for key, slow, fast in RATIOS:
        if slow in by and fast in by:
            row[key] = round(by[slow]["s_per_iter"] / by[fast]["s_per_iter"], 2)
            print(f"{key}: {row[key]}")
    # what a KL term costs per trained token (its reference pass), apart from the zero-advantage
    # sequences it also trains on
    for key, kl, plain in PER_TOKEN_RATIOS:
        if kl in by and plain in by and by[kl]["train_ms_per_token"] and by[plain]["train_ms_per_token"]:
            row[key] = round(by[kl]["train_ms_per_token"] / by[plain]["train_ms_per_token"], 2)
            print(f"{key}: {row[key]}")
    report("online_iteration", row)


if __name__ == "__main__":
    main()
