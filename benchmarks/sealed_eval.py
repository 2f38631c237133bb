"""What the bookkeeping of a sealed evaluation costs at P4's scale: 24,000 evaluations
(6 checkpoints x 4 harnesses x 500 test tasks x 2 attempts) through the real evaluate stage
(:func:`tasks.evaluate.stage.run_evaluate`) with an instant scripted policy and a trivial
verifier (:class:`tasks.evaluate.scripted.ScriptedRunner`), so that only harnessrl's own code is
timed: leakage guard, plan, seal, write (contract check + Parquet + manifest), the attempts'
turns streamed to ``eval_turns``, statistics (matrix + task-clustered paired bootstrap, 10,000
resamples per contrast), exports, verify. One of the 4 harnesses is held out (evaluation only);
5% of attempts end in infra_error and are retried once. Contrasts: each trained checkpoint minus
base under each harness (20). The checkpoints are base and five training arms (``arms``).

``--turns 8 --context 2000`` (multi-turn mode): every attempt is an agentic episode of 8 turns
whose context grows to 2,000 tokens, stored as the rollout engine stores turns (each turn its added
tokens: 2,000 tokens an attempt, 48M for 24,000); the stage holds one shard of turns at a time.
Bookkeeping = the stage's seconds minus the scripted runner's own (making the rows), plus verify.

Target: bookkeeping under 60 s and 2 GB peak RSS on 2 cores, in both modes.
Prints each part's seconds and appends a JSON row to ``benchmarks/results/sealed_eval.jsonl``.
Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/sealed_eval.py [--tasks 500] [--turns 8
--context 2000]``; ``--smoke``: tiny sizes (seconds), checks the figures are there, writes the row
to ``--results`` (a test runs it).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import placeholder_episode, report  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=500, help="test-split tasks")
    ap.add_argument("--checkpoints", type=int, default=6)
    ap.add_argument("--attempts", type=int, default=2)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=1, help="turns per attempt (> 1: multi-turn mode)")
    ap.add_argument("--context", type=int, default=2000, help="multi-turn mode: context tokens at the last turn")
    ap.add_argument("--chunk", type=int, default=125, help="records per chunk the scripted runner yields (a shard)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: 8 tasks, 3 checkpoints, 4 turns x 200 tokens")
    ap.add_argument("--results", type=Path, default=None, help="JSON-lines file for the row (default results/)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.tasks, args.checkpoints, args.resamples, args.turns, args.context, args.chunk = 8, 3, 200, 4, 200, 3

    from schemas import ArtifactStore
    from tasks.config import RunConfig
    from tasks.evaluate.scripted import ScriptedRunner
    from tasks.evaluate.stage import run_evaluate
    from tasks.evaluate.verify import verify_run
    from tasks.hashing import sha256_dir
    from tasks.records.freeze import freeze_tables

    train_h = ["direct", "react-python", "openhands-like"]
    eval_h = [*train_h, "qwen-code-like"]  # the last one is held out
    arms = [f"step-{i}" for i in range(1, args.checkpoints - 1)] + ["final"]
    cks = ["base", *arms]
    contrasts = [{"name": f"{c}-vs-base:{h}", "a": {"checkpoint": c, "harness": h},
                  "b": {"checkpoint": "base", "harness": h}} for c in arms for h in eval_h]
    cfg = RunConfig.model_validate({
        "name": "sealed-bench", "suites": [{"name": "basic_arithmetic", "size": 2 * args.tasks, "seed": 0}],
        "split": {"test_fraction": 0.5}, "harnesses": train_h, "arms": [{"name": a} for a in arms],
        "evaluate": {"attempts": args.attempts, "harnesses": eval_h, "infra_retries": 1, "contrasts": contrasts,
                     "bootstrap_resamples": args.resamples},
        "analyze": {"ceiling_k": min(2, args.attempts)}})
    t0 = time.perf_counter()
    tasks, harnesses, records = freeze_tables(cfg)
    t_freeze = time.perf_counter() - t0
    n_test = sum(t["split"] == "test" for t in tasks)
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-sealed-") as tmp:
        store = ArtifactStore(Path(tmp) / "run")
        refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
                "records": store.write("freeze", "records", records), "episodes": store.write("rollout", "episodes", [placeholder_episode(records)])}
        ck_rows = [{"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "m"}]
        for i, name in enumerate(arms, 1):
            d = Path(tmp) / name
            d.mkdir()
            (d / "adapter_model.safetensors").write_bytes(os.urandom(1 << 16))
            store.put_dir(f"train/checkpoints/{name}", d)
            ck_rows.append({"name": name, "step": i, "path": f"train/checkpoints/{name}", "adapter_sha256": sha256_dir(d),
                            "base_model_id": "m"})
        refs["checkpoints"] = store.write("train", "checkpoints", ck_rows)
        runner = ScriptedRunner(p_resolve={"direct": 0.1, "react-python": 0.2, "openhands-like": 0.3,
                                           "qwen-code-like": 0.15}, infra_rate=0.05, seed=0, turns=args.turns,
                                context_tokens=args.context, chunk_records=args.chunk)
        timings: dict[str, float] = {}
        tree = TreeRSS()
        t0 = time.perf_counter()
        out = run_evaluate(store, cfg, refs, episode_runner=runner, timings=timings)
        t_stage = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = verify_run(store)
        t_verify = time.perf_counter() - t0
        evals = out["evaluations"].rows
        first = sum(n * s for tag, n, s in runner.calls if "retry" not in tag)
        turn_rows = out["eval_turns"].rows
        turns_mb = store.manifest("evaluate", "eval_turns")["bytes"] / 2**20
    ours = t_stage - runner.seconds + t_verify
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tree_mib = tree.stop()
    row = {
        "benchmark": "sealed_eval", "mode": "multi-turn" if args.turns > 1 else "single-turn", "smoke": args.smoke,
        "host": platform.node(), "cpus": os.cpu_count(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"), "test_tasks": n_test, "checkpoints": len(cks),
        "harnesses": len(eval_h), "attempts": args.attempts, "planned_evaluations": first, "sealed_rows": evals,
        "retry_rows": evals - first, "contrasts": len(contrasts), "resamples": args.resamples,
        "turns_per_attempt": args.turns, "context_tokens": args.context if args.turns > 1 else None,
        "turn_rows": turn_rows, "eval_turns_mib": round(turns_mb, 1),
        "freeze_s (not timed below)": round(t_freeze, 2),
        "scripted_runner_s (not ours)": round(runner.seconds, 2),
        **{f"{k}_s": round(v, 3) for k, v in timings.items()},
        "verify_s": round(t_verify, 3), "ours_total_s (stage - scripted runner + verify)": round(ours, 2),
        "peak_rss_mib": round(rss_mib, 1), "peak_rss_with_workers_mib": round(tree_mib, 1), "verified_rows": rep.rows,
        "within_60s_2gb": bool(ours <= 60 and max(rss_mib, tree_mib) <= 2048),
    }
    report("sealed_eval", row, args.results)
    return row


class TreeRSS:
    """The peak of the summed RSS of this process and its children (the evaluate stage's export
    worker processes), sampled every 0.1 s on a thread with psutil, in MiB. ``ru_maxrss`` cannot
    give it: a spawned child's counter starts at its parent's size at the fork."""

    def __init__(self) -> None:
        import threading

        import psutil

        self.peak, self._stop = 0.0, threading.Event()
        me = psutil.Process()

        def poll() -> None:
            while not self._stop.wait(0.1):
                total = 0
                for p in [me, *me.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:  # a worker that just ended
                        pass
                self.peak = max(self.peak, total / 2**20)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


if __name__ == "__main__":
    main()
