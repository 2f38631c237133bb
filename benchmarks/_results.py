"""Printing a benchmark's figures and appending them as one JSON row to results/<name>.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def report(name: str, row: dict[str, Any], out: Path | None = None) -> Path:
    """Print ``row`` one figure a line and append it to ``out`` (default
    ``benchmarks/results/<name>.jsonl``)."""
    width = max(len(k) for k in row) + 2
    for k, v in row.items():
        print(f"{k:>{width}}: {v}")
    out = out or Path(__file__).parent / "results" / f"{name}.jsonl"
    out.parent.mkdir(exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return out
