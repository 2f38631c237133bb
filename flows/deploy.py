"""Prefect deployments of harnessrl: the entry flow a worker runs, and ``harnessrl deploy``.

``prefect.yaml`` (repository root) declares the deployments: the whole pipeline and each stage
(a stage deployment runs the stages before it too; finished ones come back ``Cached``), each with
the run config's path as a parameter and a cron schedule. :func:`register` creates them through
the Prefect API at ``PREFECT_API_URL`` (the same file also works with ``prefect deploy --all``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect import flow

from flows.naming import PIPELINE_FLOW, flow_run_namer

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "flows/deploy.py:run_config"


@flow(name=PIPELINE_FLOW, flow_run_name=flow_run_namer())
def run_config(config: str = "configs/default.yaml", run_dir: str | None = None, stage: str | None = None,
               from_stage: str | None = None) -> dict[str, Any]:
    """Load the run config at ``config`` (relative paths: from the worker's working directory, the
    checkout) and run the pipeline's stage flows up to ``stage`` (None: all five) into ``run_dir``
    (None: ``RUN_ROOT/NAME-CONFIGHASH``). The pipeline's flow (:data:`flows.naming.PIPELINE_FLOW`,
    as ``harnessrl run``'s); its run is named after the config from its start. Returns ``{stage: {"state", "seconds", "outputs": {name:
    sha256}}}``.

    Raises:
        tasks.config.ConfigError: the config is invalid (the message names file, key, value).
    """
    from flows.naming import label_this_run, run_label, tagged
    from flows.pipeline import chain
    from tasks.config import load_config

    cfg = load_config(config)
    label_this_run(cfg)
    rd = run_dir or (f"{cfg.run_root.rstrip('/')}/{run_label(cfg)}" if "://" in cfg.run_root
                     else str(Path(cfg.run_root) / run_label(cfg)))
    if "://" not in rd:
        Path(rd).mkdir(parents=True, exist_ok=True)
    with tagged(cfg):
        result = chain(cfg, rd, from_stage, stage)
    return {s: {"state": r["state"], "seconds": r["seconds"], "outputs": {k: v.sha256 for k, v in r["outputs"].items()}}
            for s, r in result.items()}


def load_deployments(path: str | Path = REPO_ROOT / "prefect.yaml") -> list[dict[str, Any]]:
    """The ``deployments`` list of a ``prefect.yaml``. Raises ValueError when it has none or one
    lacks ``name``/``entrypoint``/``work_pool.name``."""
    p = Path(path)
    data = yaml.safe_load(p.read_text()) or {}
    deps = data.get("deployments") or []
    if not deps:
        raise ValueError(f"{p}: no deployments")
    for i, d in enumerate(deps):
        for key in ("name", "entrypoint"):
            if not d.get(key):
                raise ValueError(f"{p}: deployments[{i}] has no {key!r}")
        if not (d.get("work_pool") or {}).get("name"):
            raise ValueError(f"{p}: deployments[{i}] ({d['name']!r}) has no work_pool.name")
    return deps


def ensure_process_pool(name: str) -> None:
    """Create the work pool ``name`` (type ``process``) unless it exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def register(path: str | Path = REPO_ROOT / "prefect.yaml", names: list[str] | None = None,
             source: str | Path = REPO_ROOT) -> list[dict[str, str]]:
    """Create or update the deployments of ``path`` (all, or those in ``names``) with code from
    ``source`` (a local checkout the workers can read), creating their process work pools,
    without printing (Prefect's ``Flow.deploy`` prints a table per deployment; the caller prints
    one for all: :func:`summary_table`). Returns one row per deployment, in file order:
    ``deployment`` (``FLOW/NAME``), ``id``, ``work_pool``, ``schedule`` (each cron with its time
    zone, ``inactive`` where it is not active; ``none``) and ``parameters`` (``key=value`` lines).

    Raises:
        ValueError: a name in ``names`` is not declared in ``path``; a schedule that is not a cron.
        RuntimeError: no Prefect API answers (``PREFECT_API_URL`` unset or unreachable).
    """
    from prefect.schedules import Cron

    deps = load_deployments(path)
    known = [d["name"] for d in deps]
    for n in names or []:
        if n not in known:
            raise ValueError(f"deployment {n!r} is not in {path}; declared: {known}")
    out = []
    for d in deps:
        if names and d["name"] not in names:
            continue
        pool = d["work_pool"]["name"]
        ensure_process_pool(pool)
        f = flow.from_source(source=str(source), entrypoint=d["entrypoint"])
        schedules = []
        for s in d.get("schedules") or []:
            if "cron" not in s:
                raise ValueError(f"{path}: deployment {d['name']!r}: only cron schedules are supported, got {s}")
            schedules.append(Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True)))
        params = d.get("parameters") or {}
        dep = f.to_deployment(name=d["name"], parameters=params, description=d.get("description"),
                              tags=d.get("tags") or [], schedules=schedules or None, work_pool_name=pool)
        dep_id = dep.apply(work_pool_name=pool)
        out.append({"deployment": f"{f.name}/{d['name']}", "id": str(dep_id), "work_pool": pool,
                    "schedule": ", ".join(f"{c.cron} {c.timezone or 'UTC'}{'' if c.active else ' (inactive)'}"
                                          for c in schedules) or "none",
                    "parameters": "\n".join(f"{k}={v}" for k, v in params.items())})
    return out


def summary_table(rows: list[dict[str, str]]) -> Any:
    """One ``rich.table.Table`` of the deployments :func:`register` returned: a row each, with its
    schedule, parameters and id; the work pools in the caption (fits 120 columns)."""
    from rich.table import Table

    pools = ", ".join(dict.fromkeys(r["work_pool"] for r in rows))
    table = Table(title=f"{len(rows)} deployment(s) registered", caption=f"work pool: {pools}")
    for col in ("deployment", "schedule", "parameters", "id"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(*(r[c] for c in ("deployment", "schedule", "parameters", "id")))
    return table


def deploy_command(file: Path, names: list[str] | None, say: Any) -> None:
    """``harnessrl deploy``: register ``file``'s deployments (all, or ``names``) with the Prefect
    API at PREFECT_API_URL, print their table and how to start a worker and a run.

    Raises:
        CommandError: no PREFECT_API_URL, or a bad prefect.yaml / name (2).
    """
    import os

    from tasks.command import CommandError

    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise CommandError("PREFECT_API_URL is not set: start a server (prefect server start, or "
                               "infra/compose.yaml) and export PREFECT_API_URL=http://HOST:4200/api", 2)
    from rich.console import Console

    try:
        rows = register(file, names or None)
    except ValueError as e:
        raise CommandError(str(e), 2) from None
    Console(width=max(Console().width, 120)).print(summary_table(rows))
    say(f"start a worker:  prefect worker start --pool {rows[0]['work_pool']} --type process")
    say(f"run one now:     prefect deployment run '{rows[0]['deployment']}' -p config=configs/default.yaml")
