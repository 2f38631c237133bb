"""The logic of the commands that run something: ``harnessrl run`` (the pipeline), ``harnessrl
train`` (the pipeline through train, under torchrun) and ``harnessrl <application>`` (an
application's flow). The command line (``flows/cli.py``) parses and calls these."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flows.process_setup import one_line_for, prepare_environment, quiet_libraries, settled_server
from tasks.command import CommandError, Say


def check_cluster_or_fail(cfg: Any) -> None:
    """Raise :class:`CommandError` (exit 2) when the config names a Dask or Ray cluster that nothing
    answers at (:func:`tasks.rollout.fanout.check_cluster`), before any stage runs."""
    from tasks.rollout.fanout import check_cluster

    try:
        check_cluster(cfg.rollout)
    except ValueError as e:
        raise CommandError(str(e), 2) from None


def refuse_torchrun() -> None:
    """Raise :class:`CommandError` (exit 2) under torchrun: ``harnessrl run`` would run the whole
    pipeline once per process."""
    from tasks.train.distributed import under_torchrun

    if under_torchrun():
        raise CommandError("harnessrl run under torchrun would run the whole pipeline once per process; use "
                           "`torchrun ... harnessrl train` (then `harnessrl run` for the rest)", 2)


def run_pipeline(cfg: Any, run_dir: str | None, from_stage: str | None) -> None:
    """``harnessrl run``: freeze -> rollout -> train -> evaluate -> analyze in ``run_dir`` (default
    RUN_ROOT/NAME-CONFIGHASH; an fsspec URL is a remote store), then the summary tables. SIGTERM or
    Ctrl-C: the running stage is marked cancelled, exit 143 / 130.

    Raises:
        CommandError: an unreachable cluster (2); no workers or a changed artifact (1, the stage
            record keeps it; a rerun resumes at the failed stage).
    """
    check_cluster_or_fail(cfg)
    remote_root = "://" in cfg.run_root
    from flows.naming import run_label, tagged

    default = run_label(cfg)
    rd_s = run_dir or (f"{cfg.run_root.rstrip('/')}/{default}" if remote_root else str(Path(cfg.run_root) / default))
    if "://" in rd_s:  # a remote store (see schemas/store.py): credentials from the environment
        from schemas import ArtifactStore

        ArtifactStore(rd_s)  # creates the folder; fails early on a bad URL or credentials
        rd: Any = rd_s
    else:
        rd = Path(rd_s)
        rd.mkdir(parents=True, exist_ok=True)
    prepare_environment(Path("runs") if remote_root else Path(cfg.run_root))
    quiet_libraries()
    from flows.pipeline import pipeline

    from flows.server import start_temporary_server
    from flows.stopping import stop_on_signals
    from flows.summary import print_summary
    from schemas import ArtifactError
    from tasks.rollout.cluster import NoWorkersError

    one_line_for(NoWorkersError, ArtifactError)
    t0 = time.perf_counter()
    # SIGTERM / SIGINT: the running stage and its Prefect runs are marked cancelled, exit 143 / 130
    with stop_on_signals("harnessrl run"):
        start_temporary_server()  # without PREFECT_API_URL: it ends with this process, even on SIGKILL
        try:
            with settled_server(), tagged(cfg):  # every flow and task run carries the config's name and paper
                result = pipeline(cfg, str(rd), from_stage)
            print_summary(rd, result, time.perf_counter() - t0, cfg)
        except (NoWorkersError, ArtifactError) as e:  # the stage record keeps it; a rerun resumes at the failed stage
            # (an ArtifactError: a changed artifact the cache check refused (flows/cache.py) or a reader met)
            raise CommandError(" ".join(str(e).split()), 1) from None


def require_torchrun() -> None:
    """Raise :class:`CommandError` (exit 2) outside torchrun (RANK / WORLD_SIZE unset)."""
    from tasks.train.distributed import under_torchrun

    if not under_torchrun():
        raise CommandError("harnessrl train runs under torchrun (RANK / WORLD_SIZE unset); in one process use "
                           "harnessrl run", 2)


def train_distributed(cfg: Any, config_name: str, run_dir: str | None, from_stage: str | None, say: Say) -> None:
    """``harnessrl train`` under torchrun: rank 0 runs the pipeline through train (cached as in
    ``harnessrl run``), the other ranks join each training call.

    Raises:
        CommandError: WORLD_SIZE differs from the config, an unreachable cluster (2).
    """
    from tasks.train import distributed as D

    started = int(os.environ["WORLD_SIZE"])
    if started != cfg.train.world_size:  # every rank stops here, before freeze and rollout
        raise CommandError(f"{config_name}: train.distributed.world_size={cfg.train.world_size} but torchrun started "
                           f"{started} processes (WORLD_SIZE); set train.distributed.world_size: {started}", 2)
    check_cluster_or_fail(cfg)  # rank 0 runs the rollouts; every rank stops with it
    backend = cfg.train.distributed.backend if cfg.train.distributed is not None else "gloo"
    if int(os.environ["RANK"]) != 0:
        quiet_libraries()
        n = D.follow(backend)
        say(f"harnessrl train: rank {os.environ['RANK']} joined {n} training call(s) of rank 0")
        return
    from flows.naming import run_label, tagged

    rd = Path(run_dir or Path(cfg.run_root) / run_label(cfg))
    rd.mkdir(parents=True, exist_ok=True)
    prepare_environment(Path(cfg.run_root))
    quiet_libraries()
    from flows.pipeline import through_train

    D.join(backend)
    t0 = time.perf_counter()
    try:
        with settled_server(), tagged(cfg):
            result = through_train(cfg, str(rd), from_stage)
    finally:
        D.finish()
    for stage, r in result.items():
        say(f"{stage}: {r['state']} in {r['seconds']:.1f} s ("
            + ", ".join(f"{k}[{v.rows}]" for k, v in r["outputs"].items()) + ")")
    say(f"run folder: {rd.resolve()}\ntotal: {time.perf_counter() - t0:.1f} s; next: harnessrl run with the same "
        "config and --run-dir")


def run_application(name: str, cfg: Any, run_dir: Path | None, say: Say) -> None:
    """``harnessrl <name>``: the application's flow (:func:`flows.application.application_flow`)
    in ``run_dir`` (default RUN_ROOT/NAME-CONFIGHASH), then its ``<name>/report.md``, the run
    folder and the wall time. SIGTERM / SIGINT: cancelled, exit 143 / 130 (as ``run``)."""
    from flows.naming import run_label, tagged

    rd = run_dir or Path(cfg.run_root) / run_label(cfg)
    rd.mkdir(parents=True, exist_ok=True)
    prepare_environment(Path(cfg.run_root))
    quiet_libraries()
    from flows.application import application_flow
    from flows.server import start_temporary_server
    from flows.stopping import stop_on_signals

    run_flow = application_flow(name)
    t0 = time.perf_counter()
    with stop_on_signals(f"harnessrl {name}"):
        start_temporary_server()
        with settled_server(), tagged(cfg):
            run_flow(cfg, str(rd))
    say((rd / name / "report.md").read_text())
    say(f"run folder: {rd.resolve()}\ntotal: {time.perf_counter() - t0:.1f} s")
