"""Sandbox throughput, side by side for each available backend (bwrap, docker):

- ``<backend>_exec_true_per_s`` / ``<backend>_exec_python_per_s``: execs per second of ``true``
  and ``python3 -c pass`` in one long-lived episode sandbox (sequential, host round trip included);
- ``<backend>_episode_s``: seconds to create a sandbox, run ``true`` once and clean it up;
- ``<backend>_exec_true_wall_s``: the command's own wall time as measured inside the sandbox.

A backend that cannot start here is reported as ``<backend>_unavailable`` with the reason.
Usage: ``python benchmarks/sandbox.py [--execs N] [--episodes N] [--smoke]`` (``--smoke``: 5 execs, 2
episodes, seconds); appends a row to
``benchmarks/results/sandbox.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import report  # noqa: E402
from tasks.config import SandboxConfig  # noqa: E402
from tasks.environments.sandbox import SandboxError, make_sandbox  # noqa: E402


def bench(backend: str, execs: int, episodes: int) -> dict[str, float]:
    """Figures for one backend (see the module docstring). Raises SandboxError if it cannot start."""
    cfg = SandboxConfig(backend=backend)
    s = make_sandbox(cfg)  # warm-up: the docker image tag is computed once per process
    try:
        s.exec(["true"])
        out: dict[str, float] = {}
        for name, argv in (("true", ["true"]), ("python", ["python3", "-c", "pass"])):
            inner = []
            t0 = time.perf_counter()
            for _ in range(execs):
                r = s.exec(argv)
                assert r.status == "ok", r
                inner.append(r.wall_s)
            dt = time.perf_counter() - t0
            out[f"{backend}_exec_{name}_per_s"] = round(execs / dt, 1)
            out[f"{backend}_exec_{name}_wall_s"] = round(statistics.median(inner), 4)
    finally:
        s.cleanup()
    times = []
    for _ in range(episodes):
        t0 = time.perf_counter()
        s = make_sandbox(cfg)
        s.exec(["true"])
        s.cleanup()
        times.append(time.perf_counter() - t0)
    out[f"{backend}_episode_s"] = round(statistics.median(times), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="5 execs, 2 episodes per backend (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.execs, a.episodes = 5, 2
    row: dict[str, object] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(),
                              "cpus": os.cpu_count(), "smoke": a.smoke, "execs": a.execs, "episodes": a.episodes}
    for backend in ("bwrap", "docker"):
        try:
            row.update(bench(backend, a.execs, a.episodes))
        except SandboxError as e:
            row[f"{backend}_unavailable"] = str(e)[:200]
    report("sandbox", row)


if __name__ == "__main__":
    main()
