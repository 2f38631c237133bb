"""An estimate of a findings config's wall time from measured unit costs, before the run.

    .venv/bin/python benchmarks/findings_budget.py configs/p4-findings-v2.yaml configs/p1-findings-v2.yaml
    .venv/bin/python benchmarks/findings_budget.py --append configs/p4-findings-v2.yaml   # a row per config
    .venv/bin/python benchmarks/findings_budget.py --smoke     # P4 v2's --quick sizes, a row to the results folder

It runs nothing: it counts the episodes, training samples and sealed attempts the config plans and
prices each with a cost measured on this machine (2 idle AMD EPYC cores), so the result is an
estimate, and the row says so (``kind: estimate``). The unit costs and where each was measured:

- sampling one episode under a harness (rollout stage, online training, branching): a tool loop
  (a harness whose base cells average more than 1.5 turns) costs the P6 rerun's rollout rate
  (:data:`P6_RERUN`: 640 episodes of react-python-skill in 680 s); a single-turn harness the
  largest per-episode time of the single-turn harnesses in the idle ``arith-1d-2t`` row of
  ``benchmarks/results/task_difficulty.jsonl`` (its first cell, ``direct``, carries the engine's
  warm-up and is left out);
- training on one sample (an online arm; a frozen arm trains ``epochs x ceil(train tasks /
  batch_size)`` steps of ``batch_size`` groups at the train rate alone, no sampling or sync):
  a tool loop the P6 rerun's train rate (20 optimizer steps of 32 sequences
  per arm, 3 arms, 1,457 s), a single-turn harness the vLLM sync arm of the last
  ``benchmarks/results/online_iteration.jsonl`` row (train seconds per sample); each optimizer step
  adds that arm's weight sync, and each trained checkpoint that row's run time less its timed
  iterations (engine start and warm-up);
- one sealed attempt: the P6 rerun's evaluation rate (1,440 attempts in 1,006 s), for every harness
  (single-turn attempts cost less: an upper side).

Not priced: freezing, analysis (bootstrap, leakage probe), report writing; the split's disjointness
may drop a few tasks. The P6 rerun's figures are in docs/experiments/p6-gspo.md and the config header
of configs/p6-findings.yaml.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._results import RESULTS, report  # noqa: E402

#: the P6 rerun on 2 idle AMD EPYC cores (docs/experiments/p6-gspo.md): seconds and counts per stage
P6_RERUN = {"rollout_s": 680.0, "rollout_episodes": 640, "train_s": 1457.0, "train_sequences": 3 * 20 * 32,
            "evaluate_s": 1006.0, "evaluate_attempts": 1440}
TOOL_TURNS = 1.5


def unit_costs(results: Path = RESULTS) -> dict[str, Any]:
    """Seconds per unit, from the result tables (module docstring): ``sample_tool``,
    ``sample_single``, ``train_tool``, ``train_single``, ``sync_per_step``, ``arm_overhead``,
    ``attempt``; and ``tool_harnesses`` (names whose base cells average more than 1.5 turns).

    Raises:
        ValueError: a table lacks the row it is read from."""
    diff = [json.loads(x) for x in (results / "task_difficulty.jsonl").read_text().splitlines() if x.strip()]
    idle = [r for r in diff if not r.get("smoke") and any(c["family"] == "arith-1d-2t" for c in r["cells"])]
    if not idle:
        raise ValueError("task_difficulty.jsonl: no arith-1d-2t row (run benchmarks/task_difficulty.py)")
    cells = idle[-1]["cells"][1:]  # the first cell carries the engine's warm-up
    turns: dict[str, list[float]] = {}
    for r in diff:
        if not r.get("smoke"):
            for c in r["cells"]:
                turns.setdefault(c["harness"], []).append(c["mean_turns"])
    tools = sorted(h for h, t in turns.items() if sum(t) / len(t) > TOOL_TURNS)
    single = [c["seconds"] / c["episodes"] for c in cells if c["harness"] not in tools]
    online = [json.loads(x) for x in (results / "online_iteration.jsonl").read_text().splitlines() if x.strip()]
    arm = next((a for r in reversed(online) if not r.get("smoke") for a in r["arms"]
                if a["engine"] == "vllm" and a["max_staleness"] == 0), None)
    if arm is None or not single:
        raise ValueError("online_iteration.jsonl: no vLLM arm at max_staleness 0 (run benchmarks/online_iteration.py)")
    row = next(r for r in reversed(online) if arm in r["arms"])
    per_iter = row["prompts"] * row["group"]
    return {"sample_tool": P6_RERUN["rollout_s"] / P6_RERUN["rollout_episodes"], "sample_single": max(single),
            "train_tool": P6_RERUN["train_s"] / P6_RERUN["train_sequences"], "train_single": arm["train_s"] / per_iter,
            "sync_per_step": arm["sync_s"], "arm_overhead": arm["run_s"] - row["iters_timed"] * arm["s_per_iter"],
            "attempt": P6_RERUN["evaluate_s"] / P6_RERUN["evaluate_attempts"], "tool_harnesses": tools}


def estimate(cfg: Any, u: dict[str, Any]) -> dict[str, Any]:
    """Seconds per stage of the full run of ``cfg`` (a :class:`tasks.config.RunConfig`) at unit
    costs ``u`` (:func:`unit_costs`): ``rollout_s``, ``train_s``, ``evaluate_s``, ``branching_s``,
    ``total_s``, with the counts they price (episodes, samples, attempts, checkpoints)."""
    tool = set(u["tool_harnesses"])

    def sample(h: str) -> float:
        return u["sample_tool"] if h in tool else u["sample_single"]

    def train(h: str) -> float:
        return u["train_tool"] if h in tool else u["train_single"]

    test = sum(round(s.size * cfg.split.test_fraction) for s in cfg.suites)
    train_tasks = sum(s.size for s in cfg.suites) - test
    g = cfg.rollout.samples_per_task
    rollout_s = sum(train_tasks * g * sample(h) for h in cfg.harnesses)
    arms = cfg.arm_configs()
    train_s, samples = 0.0, 0
    for _, tc in arms:
        hs = tc.harnesses or cfg.harnesses
        if tc.mode == "frozen":  # epochs over the frozen rollouts' groups: no sampling, no sync; the
            # train rates were measured on such arms (the P6 rerun), their overhead included
            steps = tc.epochs * math.ceil(train_tasks / tc.batch_size)
            train_s += sum(steps * tc.batch_size * g * train(h) for h in hs)
            samples += steps * tc.batch_size * g * len(hs)
            continue
        per_step = sum(tc.prompts_per_step * g * (sample(h) + train(h)) for h in hs)
        train_s += tc.steps * (per_step + u["sync_per_step"]) + u["arm_overhead"]
        samples += tc.steps * tc.prompts_per_step * g * len(hs)
    checkpoints = 1 + len(arms)
    attempts = checkpoints * len(cfg.evaluate.harnesses or cfg.harnesses) * test * cfg.evaluate.attempts
    evaluate_s = attempts * u["attempt"]
    b = cfg.analyze.branching
    branching_s = sum(len(b.checkpoints) * b.episodes_per_harness * b.n * sample(h) * 3  # <= 3 visited states
                      for h in cfg.evaluate.harnesses) if b.episodes_per_harness else 0.0
    total = rollout_s + train_s + evaluate_s + branching_s
    return {"config_name": cfg.name, "kind": "estimate", "train_tasks": train_tasks, "test_tasks": test,
            "rollout_episodes": train_tasks * g * len(cfg.harnesses), "checkpoints": checkpoints,
            "train_samples": samples, "sealed_attempts": attempts, "rollout_s": round(rollout_s, 1),
            "train_s": round(train_s, 1), "evaluate_s": round(evaluate_s, 1), "branching_s": round(branching_s, 1),
            "total_s": round(total, 1), "total_h": round(total / 3600, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--append", action="store_true", help="append a row per config to findings_budget.jsonl")
    ap.add_argument("--quick", action="store_true", help="the configs' --quick sizes")
    ap.add_argument("--smoke", action="store_true", help="configs/p4-findings-v2.yaml --quick, its row appended")
    args = ap.parse_args()
    from tasks.config.run import load_config

    if args.smoke:
        args.configs, args.quick, args.append = ["configs/p4-findings-v2.yaml"], True, True
    if not args.configs:
        ap.error("name one config or more (or --smoke)")
    u = unit_costs()
    for path in args.configs:
        row = {"config": path, "quick": args.quick, "smoke": args.smoke,
               **estimate(load_config(ROOT / path, quick=args.quick), u),
               "unit_costs_s": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in u.items()}}
        if args.append:
            report("findings_budget", row)
        else:
            print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
