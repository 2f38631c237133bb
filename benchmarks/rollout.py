"""Rollout throughput: the harness engine against the bare policy engine on the same tokens, the
rollout stage's fan-out runners, and sandbox executions per second.

1. Harness vs engine, per harness: ``run_episodes`` on ``--tasks`` x ``--samples`` episodes with a
   recording wrapper around the policy (each ``generate`` call's prompts, sampling and seed).
   Then the bare engine: ``policy.generate`` replayed on exactly those calls, which produces the
   same tokens (checked, ``replay_identical``). ``overhead`` = (harness time - engine time) /
   engine time: the share the control loop, parsing, the sandbox and grading add (goal <= 0.10);
   ``overhead_same_run`` = (harness time - time inside ``generate`` in that run) / the latter.
   Each is the minimum over ``--repeats`` interleaved runs after one untimed-for-the-ratio cold run
   (``harness_cold_s``: new tensor shapes cost kernel set-up time, which a warm replay skips).
2. Rollout stage: ``run_records`` over every harness with each runner in ``--runners`` (serial,
   thread, dask), wall time including policy loads and cluster start; episodes/s, tokens/s, and
   whether every runner's rows equal the first runner's byte for byte.
3. Sandboxes: per backend in ``--backends``, warm executions/s (one sandbox, the harness's tool
   call: write ``main.py``, run ``python3 -I main.py``) and cold ones (make, exec, cleanup). A
   backend that cannot start is reported unavailable with its reason.

    .venv/bin/python benchmarks/rollout.py --model tiny --tasks 8 --samples 4
    .venv/bin/python benchmarks/rollout.py --model smollm2-135m-instruct --harness react-python --harness direct

    .venv/bin/python benchmarks/rollout.py --smoke     # tiny model, react-python, 2 tasks x 1, serial, bwrap

Prints the figures and appends one JSON row to ``benchmarks/results/rollout.jsonl``. ``--smoke``
runs the harness-vs-engine and sandbox parts at tiny sizes and skips the stage part (its point,
rows equal across runners, needs the thread and dask runners, whose start-up takes longer than a
smoke may) and the docker backend; the row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _results import report  # noqa: E402


class RecordingPolicy:
    """Passes ``generate`` through to ``policy`` and keeps each call (prompts, sampling, seed,
    token ids out) and the seconds it took."""

    def __init__(self, policy: Any):
        self.policy, self.tokenizer, self.policy_id = policy, policy.tokenizer, policy.policy_id
        self.calls: list[tuple[list[list[int]], Any, int, list[list[int]]]] = []
        self.seconds = 0.0

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int) -> list[Any]:
        t = time.perf_counter()
        gens = self.policy.generate(prompts, sampling, seed)
        self.seconds += time.perf_counter() - t
        self.calls.append(([list(p) for p in prompts], sampling, seed, [g.token_ids for g in gens]))
        return gens


def build_cfg(args: argparse.Namespace, model: str, **rollout: Any) -> Any:
    from tasks.config import RunConfig

    return RunConfig.model_validate({
        "name": "bench-rollout", "seed": args.seed,
        "suites": [{"name": args.suite, "size": args.tasks, "seed": args.seed}],
        "harnesses": args.harness,
        "policy": {"model": model, "batch_size": args.batch_size, "rollout_dtype": args.dtype},
        "rollout": {"samples_per_task": args.samples, **rollout},
    })


def harness_vs_engine(args: argparse.Namespace, model: str) -> dict[str, Any]:
    from tasks.harnesses.spec import HarnessSpec
    from tasks.hashing import seed_from
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.fanout import episode_jobs
    from tasks.rollout.harness import run_episodes
    from tasks.rollout.engines import load_policy

    cfg = build_cfg(args, model)
    tasks, harnesses, records = freeze_tables(cfg)
    tasks = {t["task_id"]: t for t in tasks}
    t = time.perf_counter()
    policy = load_policy(cfg)
    out: dict[str, Any] = {"policy_load_s": round(time.perf_counter() - t, 2)}
    policy.generate([policy.tokenizer.encode("warm up", add_special_tokens=False)],
                    HarnessSpec.model_validate(json.loads(harnesses[0]["spec_json"])).sampling, 0)
    for h in harnesses:
        spec = HarnessSpec.model_validate(json.loads(h["spec_json"]))
        recs = sorted((r for r in records if r["harness_id"] == h["harness_id"]), key=lambda r: r["record_id"])
        jobs = episode_jobs(recs, tasks, args.samples, args.seed, "bench", policy.policy_id)
        # repeats interleave harness and engine runs; the minimum of each is kept (noise only adds time)
        harness_s = engine_s = gen_in_s = float("inf")
        identical = True
        # the first (cold) run is timed on its own: torch/oneDNN build kernels for every new tensor
        # shape (in bf16 on this CPU ~20x the warm time of a tiny model's step), and a real rollout
        # keeps meeting new shapes; the repeats then compare warm harness and warm engine
        t = time.perf_counter()
        run_episodes(policy, spec, jobs, cfg.sandbox, seed=seed_from(args.seed, "bench", h["harness_id"]))
        cold_s = time.perf_counter() - t
        for _ in range(args.repeats):
            rec = RecordingPolicy(policy)
            t = time.perf_counter()
            eps, turns = run_episodes(rec, spec, jobs, cfg.sandbox, seed=seed_from(args.seed, "bench", h["harness_id"]))
            harness_s, gen_in_s = min(harness_s, time.perf_counter() - t), min(gen_in_s, rec.seconds)
            t_engine = 0.0
            for prompts, sampling, seed, want in rec.calls:
                t = time.perf_counter()
                gens = policy.generate(prompts, sampling, seed)
                t_engine += time.perf_counter() - t
                identical &= [g.token_ids for g in gens] == want
            engine_s = min(engine_s, t_engine)
        tokens = sum(len(ids) for *_, got in rec.calls for ids in got)
        execs = sum(len(json.loads(tr["action"]).get("calls") or []) for tr in turns)  # tool calls run
        p = spec.name
        out.update({
            f"{p}.episodes": len(eps), f"{p}.turns": len(turns), f"{p}.generate_calls": len(rec.calls),
            f"{p}.output_tokens": tokens, f"{p}.sandbox_execs": execs,
            f"{p}.mean_reward": round(sum(e["reward"] for e in eps) / len(eps), 3),
            f"{p}.harness_cold_s": round(cold_s, 3), f"{p}.harness_s": round(harness_s, 3), f"{p}.engine_s": round(engine_s, 3),
            f"{p}.generate_in_harness_s": round(gen_in_s, 3),
            f"{p}.harness_episodes_per_s": round(len(eps) / harness_s, 3),
            f"{p}.harness_tokens_per_s": round(tokens / harness_s, 1),
            f"{p}.engine_tokens_per_s": round(tokens / engine_s, 1),
            f"{p}.overhead": round((harness_s - engine_s) / engine_s, 4),
            f"{p}.overhead_same_run": round((harness_s - gen_in_s) / gen_in_s, 4),
            f"{p}.replay_identical": identical,
        })
    return out


def stage_runners(args: argparse.Namespace, model: str) -> dict[str, Any]:
    from tasks.harnesses.spec import HarnessSpec
    from tasks.hashing import canonical_json
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.fanout import PolicySource
    from tasks.rollout.runner import run_records

    out: dict[str, Any] = {}
    if any(r != "serial" for r in args.runners):  # outside a flow the first task run starts a local Prefect API
        from prefect import task

        t = time.perf_counter()
        task(lambda: None, name="bench-warm-up")()
        out["stage.prefect_api_start_s"] = round(time.perf_counter() - t, 2)
    first = None
    for runner in args.runners:
        cfg = build_cfg(args, model, task_runner=runner, workers=args.workers, shard_size=args.shard_size)
        tasks, harnesses, records = freeze_tables(cfg)
        specs = {h["harness_id"]: HarnessSpec.model_validate(json.loads(h["spec_json"])) for h in harnesses}
        t = time.perf_counter()
        eps, turns = run_records(PolicySource.of(cfg), cfg, specs, {x["task_id"]: x for x in tasks}, records,
                                 args.samples, args.seed, "bench")
        s = time.perf_counter() - t
        rows = canonical_json([[{k: v for k, v in e.items() if k != "record"} for e in eps], turns])
        first = first or rows
        tokens = sum(e["output_tokens"] for e in eps)
        out.update({f"stage.{runner}.s": round(s, 2), f"stage.{runner}.episodes_per_s": round(len(eps) / s, 3),
                    f"stage.{runner}.tokens_per_s": round(tokens / s, 1), f"stage.{runner}.rows_equal": rows == first})
    return out


def sandbox_rates(args: argparse.Namespace) -> dict[str, Any]:
    from pydantic import ValidationError

    from tasks.config import SandboxConfig
    from tasks.environments.sandbox import SandboxError, make_sandbox

    out: dict[str, Any] = {}
    for backend in args.backends:
        try:
            cfg = SandboxConfig(backend=backend)
            box = make_sandbox(cfg)
        except (ValidationError, SandboxError) as e:
            why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e).splitlines()[0]
            out[f"sandbox.{backend}"] = f"unavailable: {why}"
            continue
        try:
            t = time.perf_counter()
            for i in range(args.execs):
                box.write_file("main.py", f"print(sum(range({i})))\n")
                r = box.exec(["python3", "-I", "main.py"], timeout_s=cfg.wall_s)
                if r.stdout.strip() != str(sum(range(i))):
                    raise RuntimeError(f"sandbox {backend}: exec {i} printed {r.stdout!r} ({r.status}, {r.stderr!r})")
            warm = args.execs / (time.perf_counter() - t)
        finally:
            box.cleanup()
        n = max(args.execs // 4, 1)
        t = time.perf_counter()
        for i in range(n):
            b = make_sandbox(cfg)
            try:
                b.write_file("main.py", "print(7)\n")
                if b.exec(["python3", "-I", "main.py"], timeout_s=cfg.wall_s).stdout.strip() != "7":
                    raise RuntimeError(f"sandbox {backend}: a fresh sandbox's exec failed")
            finally:
                b.cleanup()
        out[f"sandbox.{backend}.warm_execs_per_s"] = round(warm, 2)
        out[f"sandbox.{backend}.cold_execs_per_s"] = round(n / (time.perf_counter() - t), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (built here), a packaged model name, or a model folder")
    ap.add_argument("--harness", action="append", help="harness name (repeatable; default react-python and direct)")
    ap.add_argument("--suite", default="basic_arithmetic")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--runners", default="serial,thread,dask", help="comma-separated; '' skips the stage timings")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shard-size", type=int, default=None)
    ap.add_argument("--backends", default="bwrap,docker")
    ap.add_argument("--execs", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="harness/engine timing repeats (the minimum is kept)")
    ap.add_argument("--parts", default="engine,stage,sandbox", help="which of engine, stage, sandbox to run")
    ap.add_argument("--smoke", action="store_true", help="tiny model, react-python, 2 tasks x 1 sample, serial, bwrap, 4 execs")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.tasks, args.samples, args.repeats, args.harness = "tiny", 2, 1, 1, ["react-python"]
        args.dtype = "float32"  # fp32: bf16 kernels for each new shape cost more than a smoke's whole run on the CPU
        args.runners, args.backends, args.execs, args.parts = "", "bwrap", 4, "engine,sandbox"
    args.parts = [p for p in args.parts.split(",") if p]
    args.harness = args.harness or ["react-python", "direct"]
    args.runners = [r for r in args.runners.split(",") if r]
    args.backends = [b for b in args.backends.split(",") if b]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-rollout-") as tmp:
        os.environ.setdefault("PREFECT_HOME", str(Path(tmp) / "prefect"))
        model = args.model
        if model == "tiny":
            from _results import tiny_model

            model = str(tiny_model(Path(tmp) / "tiny"))
        row: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(), "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2), "model": args.model, "harnesses": ",".join(args.harness),
            "suite": args.suite, "tasks": args.tasks, "samples": args.samples, "dtype": args.dtype,
            "workers": args.workers, "shard_size": args.shard_size, "repeats": args.repeats,
            "parts": ",".join(args.parts), "smoke": args.smoke,
        }
        if args.smoke:
            row["skipped"] = "the stage part (serial, thread, dask runners) and the docker backend"
        for part, fn in (("engine", harness_vs_engine), ("stage", stage_runners), ("sandbox", sandbox_rates)):
            if part in args.parts:
                row.update(fn(args, model) if part != "sandbox" else fn(args))
        row["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    report("rollout", row)


if __name__ == "__main__":
    main()
