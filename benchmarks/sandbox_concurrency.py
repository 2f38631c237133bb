"""Many bwrap sandboxes open at once through the rollout's own code path: no lost episodes.

A rollout of ``--episodes`` episodes (``--tasks`` basic_arithmetic records x ``--samples``) under
the ``react-python`` harness goes through :func:`tasks.rollout.runner.run_records` (the call the
rollout, train and evaluate stages make; ``serial`` runner, one shard), so every episode's sandbox
is open at the same time. The policy is a deterministic scripted one (:class:`ScriptedPolicy`,
the tiny test model's tokenizer): turn 0 calls the ``python`` tool with a program that prints a
known line, turn 1 answers; what is under test is the sandbox and the harness loop, not a model.
Each episode therefore makes one real exec in its own sandbox, and its observation must hold the
program's output (``observed_ok`` counts them).

While the episodes of turn 1 are sampled every sandbox is open; the policy takes its measurements
there: bwrap sandboxes alive (``peak_sandboxes``, children of this process named ``bwrap``), the
highest descriptor number of this process (``peak_fd``; ``select(2)`` refuses numbers above
1023), and the proportional set size of every sandbox process (``sandbox_pss_mib``, from each
process's ``/proc`` smaps; seconds for 1,000 sandboxes, counted in ``wall_s``). ``--hold-fds N``
opens N descriptors (``/dev/null``) before the rollout, so that even a small run puts its
sandboxes' pipes above 1023.

Figures: ``infra_errors`` (episodes with status ``infra_error``; the goal is 0), ``lost`` (episodes
not ``ok``), ``wall_s`` (the ``run_records`` call), ``host_peak_rss_mib`` (this process, ru_maxrss),
``mem_available_drop_mib`` (the host's MemAvailable at the peak against before), the RLIMIT_NOFILE
before and after (the rollout raises the soft limit for its plan), the load average at the start.

    flock /tmp/harnessrl-heavy.lock .venv/bin/python benchmarks/sandbox_concurrency.py  # 1,000 episodes
    .venv/bin/python benchmarks/sandbox_concurrency.py --smoke   # 8 episodes, 1,100 descriptors held first

Prints the figures and appends one JSON row to ``benchmarks/results/sandbox_concurrency.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._results import report, tiny_model  # noqa: E402

MARK = "harnessrl-sandbox-concurrency"
PROGRAM = f"import os\nprint('{MARK}', sum(range(1000)), os.getuid())"
EXPECTED = f"{MARK} 499500 65534"  # the sandbox's uid is 65534 (nobody)


def mem_available() -> int:
    """The host's MemAvailable (bytes, ``/proc/meminfo``)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def snapshot() -> dict[str, Any]:
    """Sandboxes alive now (bwrap children of this process), the highest descriptor number of
    this process, and the summed PSS (MiB) and count of every sandbox process."""
    import psutil

    me = psutil.Process()
    bwraps = [p for p in me.children() if _name(p) == "bwrap"]
    procs = list(bwraps)
    for b in bwraps:
        try:
            procs += b.children(recursive=True)
        except psutil.Error:
            pass
    pss = 0
    for p in procs:
        try:
            pss += p.memory_full_info().pss
        except psutil.Error:
            pass
    fds = [int(x) for x in os.listdir("/proc/self/fd")]
    return {"sandboxes": len(bwraps), "sandbox_procs": len(procs), "peak_fd": max(fds),
            "sandbox_pss_mib": round(pss / 2**20, 1), "mem_available": mem_available()}


def _name(p: Any) -> str:
    try:
        return p.name()
    except Exception:  # noqa: BLE001 - a process that just ended
        return ""


class ScriptedPolicy:
    """Deterministic replies in ``react-python``'s format: turn 0 runs :data:`PROGRAM` with the
    ``python`` tool, turn 1 answers ``Answer: 0``. At the turn-1 call (every sandbox open) it
    takes a :func:`snapshot` into ``peak``."""

    policy_id = "scripted-sandbox-concurrency"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.calls = 0
        self.peak: dict[str, Any] = {}

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int) -> list[Any]:
        from tasks.rollout.generation import Generation

        if self.calls == 0:
            text = f"Let me run it.\n```python\n{PROGRAM}\n```"
        else:
            text = "Answer: 0"
            if self.calls == 1:
                self.peak = snapshot()
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids), "stop", text) for _ in prompts]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import json

    from transformers import AutoTokenizer

    from tasks.config import RunConfig
    from tasks.harnesses.spec import HarnessSpec
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.runner import run_records

    nofile_before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = nofile_before
    want = len(os.listdir("/proc/self/fd")) + args.hold_fds + 64
    if args.hold_fds and soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise SystemExit(f"--hold-fds {args.hold_fds}: needs {want} descriptors, the hard RLIMIT_NOFILE is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(args.hold_fds)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tok = AutoTokenizer.from_pretrained(tiny_model(Path(tmp) / "tiny"))
        cfg = RunConfig.model_validate({
            "name": "bench-sandbox-concurrency", "seed": args.seed, "harnesses": ["react-python"],
            "suites": [{"name": "basic_arithmetic", "size": args.tasks, "seed": args.seed}],
            "rollout": {"samples_per_task": args.samples, "task_runner": "serial"},
            "sandbox": {"backend": "bwrap", "parallel": args.parallel},
        })
        tasks, harnesses, records = freeze_tables(cfg)
        specs = {h["harness_id"]: HarnessSpec.model_validate(json.loads(h["spec_json"])) for h in harnesses}
        records = sorted(records, key=lambda r: r["record_id"])[:args.tasks]
        if len(records) < args.tasks:
            raise SystemExit(f"--tasks {args.tasks}: basic_arithmetic froze only {len(records)} records")
        policy = ScriptedPolicy(tok)
        load = os.getloadavg()
        before = mem_available()
        t0 = time.perf_counter()
        eps, turns = run_records(policy, cfg, specs, {t["task_id"]: t for t in tasks}, records, args.samples,
                                 args.seed, "rollout")
        wall = time.perf_counter() - t0
        nofile_after = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        for fd in held:
            os.close(fd)
    peak = policy.peak
    first = {t["episode_id"]: t for t in turns if t["turn_idx"] == 0}
    status: dict[str, int] = {}
    for e in eps:
        status[e["status"]] = status.get(e["status"], 0) + 1
    errors = sorted({e["error"][:160] for e in eps if e["status"] == "infra_error"})
    return {
        "policy": "scripted (deterministic: turn 0 runs one python tool call, turn 1 answers); "
                  "tests the sandbox and harness loop, not a model",
        "path": "tasks.rollout.runner.run_records, serial runner, one shard, harness react-python, backend bwrap",
        "mem_total_mib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20),
        "loadavg_1m_at_start": round(load[0], 2),
        "episodes": len(eps), "tasks": args.tasks, "samples": args.samples, "parallel": args.parallel,
        "hold_fds": args.hold_fds,
        "peak_sandboxes": peak.get("sandboxes"), "peak_sandbox_procs": peak.get("sandbox_procs"),
        "peak_fd": peak.get("peak_fd"),
        "infra_errors": status.get("infra_error", 0), "lost": len(eps) - status.get("ok", 0), "status_counts": status,
        "infra_error_messages": errors[:3],
        "observed_ok": sum(EXPECTED in first[e["episode_id"]]["observation"] for e in eps if e["episode_id"] in first),
        "wall_s": round(wall, 2),
        "host_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sandbox_pss_mib": peak.get("sandbox_pss_mib"),
        "sandbox_pss_mib_per_sandbox": round(peak["sandbox_pss_mib"] / peak["sandboxes"], 2)
        if peak.get("sandboxes") else None,
        "mem_available_drop_mib": round((before - peak["mem_available"]) / 2**20) if peak else None,
        "nofile_before": list(nofile_before), "nofile_after": list(nofile_after),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=250, help="basic_arithmetic records (default 250)")
    ap.add_argument("--samples", type=int, default=4, help="episodes per record (default 4: 1,000 episodes)")
    ap.add_argument("--parallel", type=int, default=4, help="sandbox.parallel: tool calls at once (default 4)")
    ap.add_argument("--hold-fds", type=int, default=0, help="descriptors opened before the rollout (default 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="2 tasks x 4 samples with 1,100 descriptors held (seconds)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.tasks, a.samples, a.hold_fds = 2, 4, 1100
    for k in ("tasks", "samples", "parallel"):
        if getattr(a, k) < 1:
            raise SystemExit(f"--{k} {getattr(a, k)}: must be >= 1")
    if a.hold_fds < 0:
        raise SystemExit(f"--hold-fds {a.hold_fds}: must be >= 0")
    row = {"smoke": a.smoke, **run(a)}
    report("sandbox_concurrency", row)
    return row


if __name__ == "__main__":
    main()
