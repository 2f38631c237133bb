"""``harnessrl status``: what a run folder holds, read from its files alone (no Prefect API).

For each stage: its state, from the stage's last-run record (``.harnessrl/<stage>.json``, written
by :func:`flows.common.call_stage`) checked against its artifacts:

* ``done``: every artifact of the stage has a manifest and a Parquet file whose SHA-256 matches it;
* ``failed``: the last run of the stage raised (the record holds the error);
* ``cancelled``: the last run of the stage was stopped by SIGTERM or SIGINT (``harnessrl run``
  wrote it, :mod:`flows.stopping`); a rerun resumes there;
* ``interrupted``: the record says Running but its process is gone (same host), e.g. killed;
* ``running``: the record says Running and its process is alive (or on another host);
* ``corrupt``: a Parquet file is missing or its SHA-256 differs from its manifest;
* ``missing``: nothing of the stage is there.

Pass rates come from ``analyze/mismatch`` when present, else from ``evaluate/evaluations``
(mean of ``resolved`` per checkpoint and harness).
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from schemas import ArtifactStore
from tasks.config import STAGES

STATE_DIR = ".harnessrl"  # same as flows.common.STATE_DIR (kept import-light: no prefect here)


class NotARunError(ValueError):
    """The folder holds no stage artifacts and no stage records: it is not a harnessrl run."""


@dataclass
class ArtifactStatus:
    """One artifact: ``sha256`` (hex, of the Parquet bytes, from the manifest), ``rows``,
    ``created_at`` (UTC ISO 8601, from the manifest), ``ok`` (file present and hash matches)."""

    stage: str
    name: str
    sha256: str
    rows: int
    created_at: str
    ok: bool
    problem: str = ""


@dataclass
class StageStatus:
    """One stage: ``state`` (see the module docstring), its artifacts, the last-run record (or
    None), and stray temp files of interrupted writes (store paths)."""

    stage: str
    state: str
    artifacts: list[ArtifactStatus] = field(default_factory=list)
    record: dict[str, Any] | None = None
    stray: list[str] = field(default_factory=list)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def manifest_names(store: ArtifactStore, stage: str) -> list[str]:
    """The names of ``stage``'s artifacts in ``store`` (those with a manifest), sorted; [] when the
    stage's folder does not exist."""
    base = f"{store.root.rstrip('/')}/{stage}"
    if not store.fs.exists(base):
        return []
    names = [p.rsplit("/", 1)[-1] for p in store.fs.ls(base, detail=False)]
    return sorted(n[: -len(".manifest.json")] for n in names if n.endswith(".manifest.json") and not n.startswith("."))


def stage_status(store: ArtifactStore, stage: str) -> StageStatus:
    """The :class:`StageStatus` of ``stage`` in ``store`` (reads every artifact once to hash it)."""
    record = store.read_json(f"{STATE_DIR}/{stage}.json") if store.exists(f"{STATE_DIR}/{stage}.json") else None
    arts = []
    for name in manifest_names(store, stage):
        m = store.manifest(stage, name)
        rel = f"{stage}/{name}.parquet"
        if not store.exists(rel):
            arts.append(ArtifactStatus(stage, name, m["sha256"], m["rows"], m["created_at"], False, "file missing"))
            continue
        sha = hashlib.sha256(store.read_bytes(rel)).hexdigest()
        arts.append(ArtifactStatus(stage, name, m["sha256"], m["rows"], m["created_at"], sha == m["sha256"],
                                   "" if sha == m["sha256"] else f"file SHA-256 {sha[:12]} differs from manifest"))
    stray = store.stray_temp_files(stage)
    st = record.get("state") if record else None
    if st == "Failed":
        state = "failed"
    elif st == "Cancelled":
        state = "cancelled"
    elif st == "Running":
        local = record.get("host") == socket.gethostname()
        state = "interrupted" if local and not _alive(int(record.get("pid", 0))) else "running"
    elif arts and not all(a.ok for a in arts):
        state = "corrupt"
    elif arts:
        state = "done"
    else:
        state = "missing"
    return StageStatus(stage, state, arts, record, stray)


def run_status(store: ArtifactStore) -> list[StageStatus]:
    """Every stage's :class:`StageStatus`, in pipeline order.

    Raises:
        NotARunError: no stage has an artifact or a record (the folder is not a run).
    """
    out = [stage_status(store, s) for s in STAGES]
    if all(s.state == "missing" and s.record is None and not s.stray for s in out):
        raise NotARunError(f"{store.url}: not a harnessrl run (no stage artifacts {', '.join(STAGES)} and no "
                           f"{STATE_DIR}/ stage records)")
    return out


def pass_rates(store: ArtifactStore) -> list[dict[str, Any]]:
    """Pass rates per (checkpoint, harness): from ``analyze/mismatch`` (pass@1, ceiling, mismatch)
    when present, else from ``evaluate/evaluations`` (pass@1 = mean ``resolved``, with the number
    of graded attempts). Empty when neither exists. Reads with full contract and hash checks."""
    if store.exists("analyze/mismatch.manifest.json"):
        return [{"checkpoint": r["checkpoint"], "harness": r["harness_name"], "pass@1": r["pass_at_1"],
                 "ceiling": r["ceiling"], "ceiling_k": r["ceiling_k"], "mismatch": r["mismatch"], "graded": r["graded"],
                 "source": "analyze/mismatch"} for r in store.rows(("analyze", "mismatch"))]
    if store.exists("evaluate/evaluations.manifest.json"):
        cells: dict[tuple[str, str], list[float]] = {}
        for r in store.rows(("evaluate", "evaluations")):
            cells.setdefault((r["checkpoint"], r["harness_name"]), []).append(float(r["resolved"]))
        return [{"checkpoint": c, "harness": h, "pass@1": sum(v) / len(v), "ceiling": None, "ceiling_k": None,
                 "mismatch": None, "graded": len(v), "source": "evaluate/evaluations"}
                for (c, h), v in sorted(cells.items())]
    return []


def render(store: ArtifactStore, stages: list[StageStatus], rates: list[dict[str, Any]], console: Any) -> None:
    """Print the stage table, the artifact table and the pass-rate table with rich."""
    from rich.table import Table

    colour = {"done": "green", "failed": "red", "corrupt": "red", "interrupted": "yellow", "cancelled": "yellow",
              "running": "cyan", "missing": "dim"}
    t = Table(title=f"harnessrl run: {store.url}")
    for col in ("stage", "state", "last run", "seconds", "artifacts", "note"):
        t.add_column(col)
    for s in stages:
        rec = s.record or {}
        note = (rec.get("error") or "")[:120]
        if s.stray:
            note = (note + " " if note else "") + f"{len(s.stray)} temp file(s) of an interrupted write"
        t.add_row(s.stage, f"[{colour[s.state]}]{s.state}[/]", str(rec.get("state") or "-"),
                  f"{rec['seconds']:.1f}" if rec.get("seconds") is not None else "-",
                  str(len(s.artifacts)), note)
    console.print(t)
    a = Table(title="artifacts")
    for col in ("artifact", "sha256", "rows", "created_at", "check"):
        a.add_column(col)
    for s in stages:
        for x in s.artifacts:
            a.add_row(f"{x.stage}/{x.name}", x.sha256[:12], str(x.rows), x.created_at[:19].replace("T", " "),
                      "ok" if x.ok else f"[red]{x.problem}[/]")
    console.print(a)
    if rates:
        p = Table(title=f"pass rates ({rates[0]['source']})")
        for col in ("checkpoint", "harness", "pass@1", "ceiling", "mismatch", "graded"):
            p.add_column(col)
        for r in rates:
            p.add_row(r["checkpoint"], r["harness"], f"{r['pass@1']:.3f}",
                      "-" if r["ceiling"] is None else f"{r['ceiling']:.3f} (pass@{r['ceiling_k']})",
                      "-" if r["mismatch"] is None else f"{r['mismatch']:.3f}", str(r["graded"]))
        console.print(p)


def status_command(run_dir: str) -> None:
    """``harnessrl status``: the run's stages, artifacts and pass rates, printed with rich.

    Raises:
        CommandError: 2: not a run, or unreadable; 1: an artifact differs from its manifest.
    """
    from pathlib import Path

    from rich.console import Console

    from schemas import ArtifactError
    from tasks.command import CommandError

    if "://" not in run_dir and not Path(run_dir).is_dir():
        raise CommandError(f"{run_dir}: no such run folder", 2)
    try:
        store = ArtifactStore(run_dir)
        stages = run_status(store)
        rates = pass_rates(store) if not any(s.state == "corrupt" for s in stages) else []
    except NotARunError as e:
        raise CommandError(str(e), 2) from None
    except (ArtifactError, OSError) as e:
        raise CommandError(f"{run_dir}: cannot read the run: {e}", 2) from None
    render(store, stages, rates, Console(width=max(Console().width, 120)))
    if any(s.state == "corrupt" for s in stages):
        raise CommandError("", 1)
