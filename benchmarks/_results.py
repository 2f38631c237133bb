"""Printing a benchmark's figures and appending them as one JSON row to results/<name>.jsonl.

Every row gets ``commit`` (git SHA of the checkout, ``+dirty`` when tracked files differ), ``date``
(UTC, ISO 8601) and ``machine`` (platform, CPU model, CPU count, torch device, and the load
averages when the benchmark started and when it reported) ahead of the benchmark's own figures,
so a row says where, on what code and beside what else it was measured. The docs' benchmarks page
(``scripts/gen_docs.py``) is generated from these files.

``HARNESSRL_BENCH_RESULTS`` (a folder) sends the rows to ``<folder>/<name>.jsonl`` instead of the
tracked ``benchmarks/results/``: the tests' smoke runs set it so they never append to the
tracked files. ``HARNESSRL_TINY_MODEL`` (a folder) hands the smokes the tiny model the test suite
has already built (:func:`tiny_model`), so that each does not build its own.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

# the 1-minute load average when the benchmark imported this module: before it ran anything heavy,
# so it counts other jobs' runnable threads (and the minute before the start), not its own
_LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

RESULTS = Path(__file__).resolve().parent / "results"
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # schemas.machine, when a benchmark runs as a script
    sys.path.insert(1, _ROOT)
ENV = "HARNESSRL_BENCH_RESULTS"


def commit() -> str | None:
    """``git rev-parse HEAD`` of this checkout, with ``+dirty`` when tracked files are modified
    (other than the result rows under ``benchmarks/results/``)."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        # the rows themselves (benchmarks/results/) are not code: a run appending one leaves the next clean
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/results"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sha.stdout.strip() + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """Platform, the CPU's model name (``schemas.machine.cpu_facts``), CPU count, the torch device a
    run could use (``none``: the benchmark never imported torch, so none was used), and
    ``load_start`` / ``load_end``: the 1-minute load average when the benchmark started (other
    jobs) and when it reported (its own threads plus any others); None where the OS has none."""
    from schemas.machine import cpu_facts

    torch = sys.modules.get("torch")
    if torch is None:
        device = "none"
    elif torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        device = "cpu"
    load_end = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    return {"platform": platform.platform(), "cpu_model": cpu_facts()["model"], "cpus": os.cpu_count(),
            "torch_device": device, "load_start": None if _LOAD_AT_START is None else round(_LOAD_AT_START, 2),
            "load_end": load_end}


def results_path(name: str, out: Path | None = None) -> Path:
    """Where ``report`` appends: ``out``, else ``$HARNESSRL_BENCH_RESULTS/<name>.jsonl``, else
    ``benchmarks/results/<name>.jsonl``."""
    if out is not None:
        return Path(out)
    folder = os.environ.get(ENV)
    return (Path(folder) if folder else RESULTS) / f"{name}.jsonl"


def report(name: str, row: dict[str, Any], out: Path | None = None) -> Path:
    """Print ``row`` one figure a line and append it, after ``commit``, ``date`` and ``machine``,
    to :func:`results_path`. Returns the file."""
    row = {"commit": commit(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), **row}
    width = max(len(k) for k in row) + 2
    for k, v in row.items():
        print(f"{k:>{width}}: {v}")
    out = results_path(name, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return out


def tiny_model(folder: str | Path) -> Path:
    """The tests' tiny model (``build_tiny_model(seed=0)``, 2 layers, hidden 128, vocabulary 1024):
    the folder ``$HARNESSRL_TINY_MODEL`` when it holds one, else built into ``folder`` (which
    trains its tokenizer: seconds)."""
    given = os.environ.get("HARNESSRL_TINY_MODEL")
    if given and (Path(given) / "config.json").is_file():
        return Path(given)
    from tasks.rollout.models import build_tiny_model

    return build_tiny_model(Path(folder), seed=0)


def placeholder_episode(records: list[dict]) -> dict:
    """One episode row of the first train record: the rollout artifact a benchmark that trains
    online or evaluates alone still has to hand its stage (an ``episodes`` artifact may not be
    empty); the stages only pass it through their leakage guard."""
    rec = next(r for r in records if r["split"] == "train")
    return {"episode_id": "placeholder", "record_id": rec["record_id"], "task_id": rec["task_id"],
            "task_hash": rec["task_hash"], "harness_id": rec["harness_id"], "harness_name": rec["harness_name"],
            "split": "train", "policy_id": "p", "policy_version": 0, "group_id": "g", "sample_idx": 0, "seed": 0,
            "reward": 0.0, "success": False, "status": "ok", "stop_reason": "submitted", "num_turns": 1,
            "input_tokens": 1, "output_tokens": 1, "final_answer": "", "answer_parsed": False}
