"""What the byte check of a cached stage costs (``flows/cache.py``): on a rerun, every artifact a
cached stage result names is streamed through SHA-256 and its manifest read before the stage
counts as ``Cached``. This times that check (:func:`flows.cache.artifact_problem`) over every
artifact of a run folder, stage by stage, cold and warm (the second pass reads from the page
cache, as a rerun soon after the run does).

Prints bytes, seconds and MB/s per stage and in all, and appends one JSON row to
``benchmarks/results/cache_check.jsonl``. Usage:
``.venv/bin/python benchmarks/cache_check.py --run-dir runs/p6-findings-...`` (a finished run);
``--smoke``: a synthetic run folder of one small artifact per stage (seconds), to show the script
runs. "Cold" is only cold when the page cache does not hold the files (the first read after a
reboot, or ``echo 1 > /proc/sys/vm/drop_caches`` as root, which ``--drop-caches`` tries).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _results import report

STAGES = ("freeze", "rollout", "train", "evaluate", "analyze")


def check_run(run_dir: str) -> dict[str, dict[str, float]]:
    """``{stage: {"artifacts", "bytes", "seconds"}}``: one :func:`flows.cache.artifact_problem`
    per artifact of the stage (refs from the manifests). Raises AssertionError when one fails (the
    figure would not be the cost of a passing check)."""
    from flows.cache import artifact_problem
    from flows.status import manifest_names
    from schemas import ArtifactStore

    store = ArtifactStore(run_dir)
    out = {}
    for stage in STAGES:
        refs = [store.ref(stage, n) for n in manifest_names(store, stage)]
        size = sum(int(store.manifest(r.stage, r.name).get("bytes") or os.path.getsize(Path(run_dir) / r.path))
                   for r in refs)
        t0 = time.perf_counter()
        problems = [(r.path, artifact_problem(store, r)) for r in refs]
        seconds = time.perf_counter() - t0
        bad = [p for p in problems if p[1] is not None]
        assert not bad, f"{run_dir}: {bad[0][0]}: {bad[0][1]}"
        out[stage] = {"artifacts": len(refs), "bytes": size, "seconds": seconds}
    return out


def smoke_run(folder: Path) -> str:
    """A run folder with one ``kl_check`` artifact per stage (the check reads any contract alike)."""
    from schemas import ArtifactStore
    from tasks.train.kl_check import kl_check_table

    rows = kl_check_table(vocab=2, length=1, samples=8, seed=0)
    store = ArtifactStore(folder)
    for stage in STAGES:
        store.write(stage, "kl_check", rows, config_hash="")
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", help="a finished run folder (its artifacts must verify)")
    ap.add_argument("--drop-caches", action="store_true", help="try to drop the page cache first (root)")
    ap.add_argument("--smoke", action="store_true", help="a synthetic run folder, one small artifact per stage")
    args = ap.parse_args()
    if args.smoke:
        tmp = tempfile.TemporaryDirectory()
        run_dir = smoke_run(Path(tmp.name) / "run")
    elif args.run_dir:
        run_dir = args.run_dir
    else:
        ap.error("--run-dir RUN (a finished run folder) or --smoke")
    dropped = False
    if args.drop_caches:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            dropped = True
        except OSError:
            pass
    first = check_run(run_dir)
    second = check_run(run_dir)
    total_bytes = sum(s["bytes"] for s in first.values())
    row = {"run_dir": os.path.basename(os.path.normpath(run_dir)), "page_cache_dropped": dropped,
           "artifacts": sum(s["artifacts"] for s in first.values()), "bytes": total_bytes,
           "first_s": round(sum(s["seconds"] for s in first.values()), 4),
           "warm_s": round(sum(s["seconds"] for s in second.values()), 4),
           "stages": {k: {"artifacts": v["artifacts"], "bytes": v["bytes"], "first_s": round(v["seconds"], 4),
                          "warm_s": round(second[k]["seconds"], 4)} for k, v in first.items()},
           "smoke": args.smoke}
    row["warm_mb_per_s"] = round(total_bytes / 1e6 / row["warm_s"], 1) if row["warm_s"] > 0 else None
    for k, v in row["stages"].items():
        print(f"{k:9s} {v['artifacts']:3d} artifacts {v['bytes'] / 1e6:9.2f} MB  first {v['first_s']:.3f} s  "
              f"warm {v['warm_s']:.3f} s")
    print(f"all       {row['artifacts']:3d} artifacts {total_bytes / 1e6:9.2f} MB  first {row['first_s']:.3f} s  "
          f"warm {row['warm_s']:.3f} s  ({row['warm_mb_per_s']} MB/s warm)")
    report("cache_check", row)


if __name__ == "__main__":
    main()
