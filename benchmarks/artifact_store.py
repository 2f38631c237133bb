"""What the artifact contracts cost: writing and reading an ``episodes``-shaped artifact through
``schemas.ArtifactStore`` (schema check + Great Expectations suite + SHA-256 + manifest + atomic
rename) against a bare ``pyarrow.parquet`` write and read of the same table, in one run.

Prints the figures and appends one JSON row to ``benchmarks/results/artifact_store.jsonl``.
Usage: ``.venv/bin/python benchmarks/artifact_store.py [--rows 200000]``; ``--smoke``: 2,000 rows, one
repeat (seconds), to show the script runs.
"""

from __future__ import annotations

import argparse
import io
import platform
import tempfile
import time
from pathlib import Path

from _results import report

import pyarrow as pa
import pyarrow.parquet as pq


def _rows(n: int) -> list[dict]:
    return [{
        "episode_id": f"e{i:09d}", "record_id": f"r{i // 8:08d}", "task_id": f"t{i // 16}", "task_hash": f"h{i // 16}",
        "harness_id": "H" if i % 2 else "G", "harness_name": "direct" if i % 2 else "react-python", "split": "train",
        "policy_id": "p", "policy_version": 0, "group_id": f"g{i // 8}", "sample_idx": i % 8, "seed": i,
        "reward": (i % 3) / 2, "success": i % 3 == 2, "status": "ok", "num_turns": 1 + i % 3,
        "input_tokens": 100 + i % 50, "output_tokens": 60, "final_answer": str(i % 97), "answer_parsed": i % 5 > 0,
    } for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="2,000 rows, one repeat (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.repeats = 2_000, 1
    from schemas import ArtifactStore
    from schemas.contracts import get_contract
    from schemas.validation import check_expectations

    contract = get_contract("episodes")
    table = pa.Table.from_pylist(_rows(args.rows), schema=contract.schema)
    check_expectations(contract, table.slice(0, 10))  # warm the Great Expectations context once
    best = {"store_write": 1e9, "store_read": 1e9, "bare_write": 1e9, "bare_read": 1e9}
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(Path(tmp) / "run")
        for _ in range(args.repeats):
            t = time.perf_counter()
            ref = store.write("rollout", "episodes", table)
            best["store_write"] = min(best["store_write"], time.perf_counter() - t)
            t = time.perf_counter()
            back = store.read(ref)
            assert back.num_rows == args.rows, back.num_rows
            best["store_read"] = min(best["store_read"], time.perf_counter() - t)
            t = time.perf_counter()
            buf = io.BytesIO()
            pq.write_table(table, buf, compression="zstd")
            (Path(tmp) / "bare.parquet").write_bytes(buf.getvalue())
            best["bare_write"] = min(best["bare_write"], time.perf_counter() - t)
            t = time.perf_counter()
            pq.read_table(Path(tmp) / "bare.parquet")
            best["bare_read"] = min(best["bare_read"], time.perf_counter() - t)
    row = {
        "benchmark": "artifact_store", "smoke": args.smoke, "rows": args.rows, "repeats": args.repeats, "python": platform.python_version(),
        **{f"{k}_s": round(v, 4) for k, v in best.items()},
        "write_overhead_ratio": round(best["store_write"] / best["bare_write"], 2),
        "read_overhead_ratio": round(best["store_read"] / best["bare_read"], 2),
        "store_write_rows_per_s": round(args.rows / best["store_write"]),
    }
    report("artifact_store", row)


if __name__ == "__main__":
    main()
