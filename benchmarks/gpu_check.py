"""The Python half of ``benchmarks/gpu_check.sh``: run one config through the train stage (or the
whole pipeline) with overrides, and read a run folder's speed and log-prob agreement figures.

    python benchmarks/gpu_check.py run CONFIG RUN_DIR [--quick] [--until train] [--set K=V ...]
    python benchmarks/gpu_check.py figures LABEL GPU_RUN_DIR [CPU_RUN_DIR]
    python benchmarks/gpu_check.py cpu-dir CONFIG [--quick] [--set K=V ...]

``cpu-dir`` prints the run folder ``harnessrl run`` uses by default for the config with the
overrides but on the CPU (``policy.device: cpu``): where the CPU figures of the same run are.

``figures`` prints one table: sampling tokens/s (generated tokens over the rollout stage's
seconds, or over the online sampler's seconds), train seconds per step and tokens/s per step
(the trainer's own timing, ``train_steps``' manifest), and the sampler/trainer log-prob agreement
(max and mean |sampler - trainer| nats over the policy tokens, ``logp_mismatch_*``, and the weight
sync canary's max, ``sync_max_abs_logp_diff``), for the GPU run beside the CPU run of the same
config when one is given and exists. Appends the row to ``benchmarks/results/gpu_check.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sets(pairs: list[str]) -> dict[str, Any]:
    import yaml

    return {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in pairs)}


def _cpu_dir(args: argparse.Namespace) -> None:
    from tasks.config import load_config

    cfg = load_config(Path(args.config), {**_sets(args.set), "policy.device": "cpu"}, quick=args.quick)
    print(f"{cfg.run_root.rstrip('/')}/{cfg.name}-{cfg.config_hash()[:10]}")


def _run(args: argparse.Namespace) -> None:
    from flows.process_setup import prepare_environment, quiet_libraries
    from tasks.config import load_config

    cfg = load_config(Path(args.config), _sets(args.set), quick=args.quick)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    prepare_environment(Path(cfg.run_root))
    quiet_libraries()
    from flows.pipeline import pipeline, through_train

    t0 = time.perf_counter()
    out = through_train(cfg, args.run_dir) if args.until == "train" else pipeline(cfg, args.run_dir)
    for stage, r in out.items():
        print(f"gpu_check: {stage} {r['state']} in {r['seconds']:.1f} s")
    print(f"gpu_check: {args.config} done in {time.perf_counter() - t0:.1f} s")


def figures(run_dir: str) -> dict[str, Any] | None:
    """Speed and agreement figures of one run folder (None when it holds no train stage)."""
    from schemas import ArtifactStore

    p = Path(run_dir)
    if not (p / "train").is_dir():
        return None
    store = ArtifactStore(run_dir)
    steps = store.raw_rows("train", "train_steps")
    extra = store.manifest("train", "train_steps").get("extra", {})
    timing, phases = extra.get("timing", []), extra.get("phases", [])
    out: dict[str, Any] = {"run": run_dir, "train_steps": len(steps)}
    if phases:  # online: generated tokens over the sampler's seconds
        eps = store.raw_rows("train", "online_episodes")
        sample_s = sum(ph["sample_s"] for ph in phases)
        out["sample_tokens_per_s"] = sum(e["output_tokens"] for e in eps) / sample_s if sample_s else math.nan
        out["iteration_s"] = statistics.mean(ph["iter_s"] for ph in phases)
    else:
        state_file = p / ".harnessrl" / "rollout.json"
        st = json.loads(state_file.read_text()) if state_file.is_file() else {}
        eps = store.raw_rows("rollout", "episodes")
        tok = sum(e["output_tokens"] for e in eps)
        out["sample_tokens_per_s"] = tok / st["seconds"] if st.get("state") == "Completed" and st["seconds"] else math.nan
    if timing:
        out["train_s_per_step"] = statistics.mean(t["seconds"] for t in timing)
        out["train_tokens_per_s"] = statistics.mean(t["tokens_per_s"] for t in timing)
    for key, agg in (("logp_mismatch_max", max), ("logp_mismatch_mean", statistics.mean),
                     ("sync_max_abs_logp_diff", max)):
        vals = [r[key] for r in steps if r.get(key) is not None and not math.isnan(r[key])]
        out[key] = agg(vals) if vals else math.nan
    return out


def _figures(args: argparse.Namespace) -> None:
    gpu = figures(args.gpu_run)
    if gpu is None:
        sys.exit(f"gpu_check: {args.gpu_run} holds no train stage")
    cpu = figures(args.cpu_run) if args.cpu_run else None
    keys = ["train_steps", "sample_tokens_per_s", "iteration_s", "train_s_per_step", "train_tokens_per_s",
            "logp_mismatch_max", "logp_mismatch_mean", "sync_max_abs_logp_diff"]
    print(f"\n{args.label}")
    print(f"  {'figure':<24} {'CUDA':>14} {'CPU':>14}")
    for k in keys:
        if k not in gpu and (cpu is None or k not in cpu):
            continue
        c = f"{cpu[k]:>14.4g}" if cpu is not None and k in cpu else f"{'(no CPU run)':>14}"
        print(f"  {k:<24} {gpu.get(k, math.nan):>14.4g} {c}")
    if cpu is None:
        print(f"  CPU column: no CPU run folder{' at ' + args.cpu_run if args.cpu_run else ''}; run the same config "
              "on the CPU (harnessrl run -c CONFIG) to fill it")
    row = {"label": args.label, "time": time.time(), "host": os.uname().nodename, "cuda": gpu, "cpu": cpu}
    out = Path(__file__).parent / "results" / "gpu_check.jsonl"
    out.parent.mkdir(exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("config")
    r.add_argument("run_dir")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--until", choices=["train", "analyze"], default="analyze")
    r.add_argument("--set", action="append", default=[])
    f = sub.add_parser("figures")
    f.add_argument("label")
    f.add_argument("gpu_run")
    f.add_argument("cpu_run", nargs="?")
    c = sub.add_parser("cpu-dir")
    c.add_argument("config")
    c.add_argument("--quick", action="store_true")
    c.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    {"run": _run, "figures": _figures, "cpu-dir": _cpu_dir}[args.cmd](args)


if __name__ == "__main__":
    main()
