"""``harnessrl``: the command line. Heavy imports (torch, prefect, great_expectations) happen
inside the commands, so ``--help`` stays fast."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from tasks.config.base import STAGES  # pydantic only: --help stays fast

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="harnessrl: RL for LLM agents, with the harness measured apart from the model.")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = "configs/default.yaml"
FROM_HELP = f"force this stage and every later one ({', '.join(STAGES)})"


def _default_config_path(path: Optional[Path]) -> Path:
    if path is not None:
        return path
    here = Path(DEFAULT_CONFIG)
    return here if here.is_file() else REPO_ROOT / DEFAULT_CONFIG


def _parse_sets(sets: list[str]) -> dict[str, Any]:
    import yaml

    out = {}
    for s in sets:
        if "=" not in s:
            raise typer.BadParameter(f"--set {s!r}: expected KEY=VALUE, e.g. train.steps=3")
        k, v = s.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def _config_or_exit(config: Optional[Path], sets: list[str], from_stage: Optional[str], *, quick: bool = False) -> Any:
    """The run config of ``--config`` with ``--set`` overrides (and ``--quick``), and ``--from``
    checked against the stages; a bad one is one red line and exit code 2."""
    from tasks.config import STAGES, ConfigError, load_config

    try:
        cfg = load_config(_default_config_path(config), _parse_sets(sets), quick=quick)
    except ConfigError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    if from_stage is not None and from_stage not in STAGES:
        typer.secho(f"--from {from_stage!r}: not a stage; stages are {', '.join(STAGES)}", fg="red", err=True)
        raise typer.Exit(2)
    return cfg


def _cluster_or_exit(cfg: Any) -> None:
    """One red line and exit code 2 when the config names a Dask or Ray cluster that nothing
    answers at (:func:`tasks.rollout.fanout.check_cluster`), before any stage runs."""
    from tasks.rollout.fanout import check_cluster

    try:
        check_cluster(cfg.rollout)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)


def prepare_environment(run_root: Path) -> None:
    """Settings that must exist before Prefect is imported: a Prefect home inside the run root
    (its SQLite DB stays out of the user's home), no telemetry, our loggers in the Prefect logs,
    quiet transformers."""
    os.environ.setdefault("PREFECT_HOME", str((run_root / ".prefect-home").resolve()))
    # Prefect creates its home without parents: with --run-dir elsewhere the run root may not exist yet
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # 20 s is short on a busy host
    # a temporary server stores events every second, not every 5: the run's end waits for them (flows/server.py)
    os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "1")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "harnessrl")
    # our loggers also log from worker threads outside any flow run (the online sampler's thread):
    # those lines go to the console only, without Prefect's per-line "no flow run id" warning
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@app.command()
def run(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=f"run config (default {DEFAULT_CONFIG})"),
    from_stage: Optional[str] = typer.Option(None, "--from", help=FROM_HELP),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run folder or fsspec URL, e.g. s3://bucket/runs/x "
                                          "(default RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="override a config key, e.g. --set train.steps=3"),
    quick: bool = typer.Option(False, "--quick", help="apply the config's own `quick` section first (a smaller "
                               "version of the experiment)"),
) -> None:
    """Run the pipeline: freeze -> rollout -> train -> evaluate -> analyze. Finished stages are cached
    (while their artifacts' bytes match their manifests). SIGTERM or Ctrl-C stops it within seconds:
    the running stage is marked cancelled (a rerun resumes there), exit 143 / 130."""
    from tasks.train.distributed import under_torchrun

    if under_torchrun():
        typer.secho("harnessrl run under torchrun would run the whole pipeline once per process; use "
                    "`torchrun ... harnessrl train` (then `harnessrl run` for the rest)", fg="red", err=True)
        raise typer.Exit(2)

    cfg = _config_or_exit(config, set_, from_stage, quick=quick)
    _cluster_or_exit(cfg)
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
    _quiet_libraries()
    from flows.pipeline import pipeline

    from flows.server import start_temporary_server
    from flows.stopping import stop_on_signals
    from schemas import ArtifactError
    from tasks.rollout.cluster import NoWorkersError

    _one_line_for(NoWorkersError, ArtifactError)
    t0 = time.perf_counter()
    # SIGTERM / SIGINT: the running stage and its Prefect runs are marked cancelled, exit 143 / 130
    with stop_on_signals("harnessrl run"):
        start_temporary_server()  # without PREFECT_API_URL: it ends with this process, even on SIGKILL
        try:
            with _settled_server(), tagged(cfg):  # every flow and task run carries the config's name and paper
                result = pipeline(cfg, str(rd), from_stage)
            _print_summary(rd, result, time.perf_counter() - t0, cfg)
        except (NoWorkersError, ArtifactError) as e:  # the stage record keeps it; a rerun resumes at the failed stage
            # (an ArtifactError: a changed artifact the cache check refused (flows/cache.py) or a reader met)
            typer.secho(" ".join(str(e).split()), fg="red", err=True)
            raise typer.Exit(1)


@app.command("train")
def train_cmd(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=f"run config (default {DEFAULT_CONFIG})"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run folder (shared by every host; default "
                                          "RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="override a config key, e.g. --set train.epochs=2"),
    from_stage: Optional[str] = typer.Option(None, "--from", help=FROM_HELP),
) -> None:
    """The pipeline through the train stage, data-parallel under torchrun:
    `torchrun --nproc-per-node N $(which harnessrl) train -c CONFIG --run-dir RUN` with
    train.distributed.world_size N (times the hosts). Rank 0 runs freeze, rollout and train (cached
    as in `harnessrl run`); the other ranks join each training call. Then `harnessrl run` with the
    same config and run folder evaluates and analyzes."""
    from tasks.train import distributed as D

    if not D.under_torchrun():
        typer.secho("harnessrl train runs under torchrun (RANK / WORLD_SIZE unset); in one process use harnessrl run",
                    fg="red", err=True)
        raise typer.Exit(2)
    cfg = _config_or_exit(config, set_, from_stage)
    started = int(os.environ["WORLD_SIZE"])
    if started != cfg.train.world_size:  # every rank stops here, before freeze and rollout
        typer.secho(f"{config or DEFAULT_CONFIG}: train.distributed.world_size={cfg.train.world_size} but torchrun "
                    f"started {started} processes (WORLD_SIZE); set train.distributed.world_size: {started}",
                    fg="red", err=True)
        raise typer.Exit(2)
    _cluster_or_exit(cfg)  # rank 0 runs the rollouts; every rank stops with it
    backend = cfg.train.distributed.backend if cfg.train.distributed is not None else "gloo"
    if int(os.environ["RANK"]) != 0:
        _quiet_libraries()
        n = D.follow(backend)
        typer.echo(f"harnessrl train: rank {os.environ['RANK']} joined {n} training call(s) of rank 0")
        return
    from flows.naming import run_label, tagged

    rd = Path(run_dir or Path(cfg.run_root) / run_label(cfg))
    rd.mkdir(parents=True, exist_ok=True)
    prepare_environment(Path(cfg.run_root))
    _quiet_libraries()
    from flows.pipeline import through_train

    D.join(backend)
    t0 = time.perf_counter()
    try:
        with _settled_server(), tagged(cfg):
            result = through_train(cfg, str(rd), from_stage)
    finally:
        D.finish()
    for stage, r in result.items():
        typer.echo(f"{stage}: {r['state']} in {r['seconds']:.1f} s ("
                   + ", ".join(f"{k}[{v.rows}]" for k, v in r["outputs"].items()) + ")")
    typer.echo(f"run folder: {rd.resolve()}\ntotal: {time.perf_counter() - t0:.1f} s; next: harnessrl run with the "
               "same config and --run-dir")


@contextlib.contextmanager
def _settled_server() -> Iterator[None]:
    """Run the body, then (also when it raised an exception; not after Ctrl-C) wait until
    Prefect's temporary server, if this process started one, has recorded everything the run
    sent (:func:`flows.server.settle_temporary_server`): stopped at exit while it still writes,
    it prints an ERROR line and a CancelledError traceback."""
    import datetime as dt

    from flows.server import settle_temporary_server

    since = dt.datetime.now(dt.timezone.utc)
    try:
        yield
    except Exception:
        settle_temporary_server(since)
        raise
    settle_temporary_server(since)


def _quiet_libraries() -> None:
    import logging
    import warnings

    # peft 0.21 reads `model.is_gradient_checkpointing` when it wraps a model (peft_model.py), which
    # transformers 5 deprecates in favour of `is_activation_checkpointing`: their cause, not ours.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:
        pass
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    logging.getLogger("harnessrl").setLevel(logging.INFO)


class _NoTraceback:
    """A logging filter that keeps a record's message but drops its traceback when the exception
    (or one it was raised from) is one of ``kinds``: errors whose one-line message says it all."""

    def __init__(self, kinds: tuple[type[BaseException], ...]) -> None:
        self.kinds = kinds

    def filter(self, record: Any) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        seen = 0
        while exc is not None and seen < 10:
            if isinstance(exc, self.kinds):
                record.exc_info, record.exc_text = None, None
                break
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return True


def _one_line_for(*kinds: type[BaseException]) -> None:
    """Prefect's engines log a failed task or flow run with its traceback; for ``kinds`` the
    run ends in one red line instead (the handlers of every configured logger get the filter)."""
    import logging

    f = _NoTraceback(kinds)
    loggers = [logging.getLogger()] + [lg for name, lg in logging.root.manager.loggerDict.items()
                                       if name.startswith("prefect") and isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if not any(isinstance(x, _NoTraceback) for x in h.filters):
                h.addFilter(f)


def _print_summary(rd: Any, result: dict[str, Any], total: float, cfg: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from schemas import ArtifactStore

    console = Console()
    t = Table(title=f"harnessrl run: {rd}")
    for col in ("stage", "state", "seconds", "artifacts"):
        t.add_column(col)
    for stage, r in result.items():
        t.add_row(stage, r["state"], f"{r['seconds']:.1f}",
                  ", ".join(f"{k}[{v.rows}]" for k, v in r["outputs"].items()))
    console.print(t)
    store = ArtifactStore(rd)
    m = store.rows(result["analyze"]["outputs"]["mismatch"])
    # compact (simple box, one line per row) so that it fits 80 columns without cutting a name
    from rich import box

    from flows.summary import NEXT_CONFIG, infra_line, reading
    from tasks.evaluate.stats import pass_at_1_intervals

    ev = result["evaluate"]["outputs"]
    ci = pass_at_1_intervals(store.rows(ev["evaluations"]), cfg.evaluate.bootstrap_resamples, cfg.evaluate.seed)
    ks = sorted({r["ceiling_k"] for r in m})
    p = Table(title="sealed evaluation (test split)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              caption="95% CI: percentile bootstrap over test tasks")
    infra = any(r["infra_errors"] for r in m)
    for col in ("checkpoint", "harness", "pass@1", "95% CI", f"ceiling@{ks[0]}" if len(ks) == 1 else "ceiling",
                "mismatch", "graded", *(["infra"] if infra else [])):
        p.add_column(col, no_wrap=True)
    for r in m:
        ceiling = f"{r['ceiling']:.3f}" if len(ks) == 1 else f"{r['ceiling']:.3f} (pass@{r['ceiling_k']})"
        c = ci.get((r["checkpoint"], r["harness_name"]))
        p.add_row(r["checkpoint"], r["harness_name"], f"{r['pass_at_1']:.3f}",
                  f"[{c[1]:.2f}, {c[2]:.2f}]" if c else "n/a (none graded)", ceiling, f"{r['mismatch']:.3f}",
                  str(r["graded"]), *([str(r["infra_errors"])] if infra else []))
    console.print(p)
    contrasts = store.rows(ev["eval_contrasts"])
    if contrasts:
        q = Table(title=f"pre-registered contrasts (a - b, paired on tasks; Bonferroni over {len(contrasts)})",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col in ("contrast", "a - b", "interval", "tasks"):
            q.add_column(col, no_wrap=True)
        for c in contrasts:
            est = "n/a" if c["estimate"] is None else f"{c['estimate']:+.3f}"
            iv = f"n/a ({c['status']})" if c["ci_low"] is None else f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
            q.add_row(c["name"], est, iv, str(c["n_tasks"]))
        console.print(q)
        console.print(reading(contrasts), highlight=False)
    from tasks.analysis.infra import infra_counts, online_arm_names

    line = infra_line(infra_counts(store, online_arm_names(cfg)))
    if line:
        console.print(line, highlight=False)
    if cfg.name in NEXT_CONFIG:
        console.print(f"next: {NEXT_CONFIG[cfg.name]}", highlight=False)
    console.print(f"run folder: {rd.resolve() if isinstance(rd, Path) else rd}")
    console.print(f"report:     {(rd / 'analyze' / 'report.md').resolve() if isinstance(rd, Path) else f'{rd}/analyze/report.md'}")
    console.print(f"total:      {total:.1f} s")


@app.command()
def verify(run_dir: Path = typer.Argument(..., help="a run folder"),
           public_key: Optional[Path] = typer.Option(None, "--public-key",
                                                     help="the expected Ed25519 public key (PEM) of the signer"),
           witness: bool = typer.Option(False, "--witness",
                                        help="also check plan hash and chain head against the Prefect API's artifacts"),
           findings_file: Optional[Path] = typer.Option(None, "--findings", help="also compare the rows of this "
                                                        "findings JSONL file that name the run's config hash")) -> None:
    """Recompute a run's sealed evaluation (plan hash, checkpoint files, hash chain, statistics,
    exports, Inspect logs) and its Ed25519 signatures (with --public-key: by that key). On another CPU
    or numpy kernel than the one recorded in the statistics' manifests, one line says so and which
    recomputed values are then compared within tolerance (hashes and exports stay bytes).
    Exit 0: verified; 1: tampered (the first difference is named); 2: not a run, or unreadable (one
    line says which)."""
    from schemas import ArtifactError, ArtifactStore
    from tasks.evaluate.exports import check_inspect_logs
    from tasks.evaluate.seal import SealError
    from tasks.evaluate.verify import NotARunError, verify_run

    if not run_dir.is_dir():
        typer.secho(f"NOT A RUN: {run_dir}: no such folder", fg="red", err=True)
        raise typer.Exit(2)
    expected = None
    if public_key is not None:
        try:
            expected = public_key.read_bytes()
        except OSError as e:
            typer.secho(f"--public-key={str(public_key)!r}: cannot be read ({e.strerror})", fg="red", err=True)
            raise typer.Exit(2)
        from tasks.evaluate.signing import fingerprint

        try:
            fingerprint(expected)
        except ValueError as e:
            typer.secho(f"--public-key={str(public_key)!r}: not an Ed25519 public key in PEM ({e})", fg="red", err=True)
            raise typer.Exit(2)
    from tasks.talkmesh.seal import PLAN as TALKMESH_PLAN

    # a TalkMesh run has its own plan and no evaluation plan (its freeze still signs the
    # pre-registration, so an evaluate/ folder with the public key may exist)
    talkmesh = (run_dir / TALKMESH_PLAN).is_file() and not (run_dir / "evaluate" / "plan.json").is_file()
    if talkmesh and (witness or findings_file is not None):
        typer.secho(f"{'--witness' if witness else '--findings'}: not built for a TalkMesh run (harnessrl talkmesh "
                    "records no witness and its findings rows are checked by harnessrl findings)", fg="red", err=True)
        raise typer.Exit(2)
    from tasks.evaluate.verify import recompute_note

    note = recompute_note(ArtifactStore(run_dir), talkmesh=talkmesh)
    if note:  # another CPU or numpy kernel than the one that wrote the statistics: say what is exact
        typer.secho(note, fg="yellow")
    try:
        if talkmesh:  # harnessrl talkmesh's own seal: plan, chain, signatures, the findings recomputed
            from tasks.talkmesh.seal import verify_talkmesh

            rep = verify_talkmesh(ArtifactStore(run_dir), public_key=expected)
        else:
            rep = verify_run(ArtifactStore(run_dir), public_key=expected)
            check_inspect_logs(str(run_dir), strict=True)  # the Inspect logs against the sealed rows (SealError)
        if witness:
            from tasks.evaluate.witness import check_witness

            try:
                seen = check_witness(rep.plan_hash, rep.head)
            except RuntimeError as e:
                typer.secho(f"--witness: no Prefect API answers ({type(e).__name__}: {e})", fg="red", err=True)
                raise typer.Exit(2)
            typer.echo(f"witnessed by the Prefect API: plan at {seen['plan']}, head at {seen['head']}")
        if findings_file is not None:
            from flows.published_findings import check_published

            got = check_published(ArtifactStore(run_dir), findings_file, run_dir.resolve().name.rsplit("-", 1)[-1],
                                  plan_hash=rep.plan_hash, fingerprint=rep.fingerprint)
            typer.echo(f"{findings_file}: {got.compared} row(s) of this run recomputed and equal"
                       + (f"; {got.other_runs} row(s) of the same config from another run (another sealed plan or "
                          "signing key) not compared" if got.other_runs else ""))
    except NotARunError as e:
        typer.secho(f"NOT A RUN: {e}", fg="red", err=True)
        raise typer.Exit(2)
    except (SealError, ArtifactError, KeyError, ValueError) as e:
        typer.secho(f"VERIFY FAILED: {e}", fg="red", err=True)
        raise typer.Exit(1)
    typer.secho(f"verified: plan {rep.plan_hash[:16]}, {rep.rows} sealed rows, head {rep.head[:16]}, "
                f"signed by {rep.fingerprint}", fg="green")


@app.command()
def findings(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=f"run config (default {DEFAULT_CONFIG})"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="the run folder (default RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="the same overrides the run was given"),
    quick: bool = typer.Option(False, "--quick", help="the run was made with --quick"),
    append: Optional[Path] = typer.Option(None, "--append", help="append the rows to this JSONL file (e.g. "
                                          "benchmarks/results/findings.jsonl)"),
) -> None:
    """Verify a finished run and print its findings as JSON rows (paper, headline, estimate, interval,
    verdict, control, config hash, commit, signing key, wall time); --append adds them to a file and
    copies the run's figures to docs/img/findings/ for the findings page. For a `harnessrl talkmesh`
    config (P3) the run's own seal is verified and its pre-registered findings printed, with the
    accuracy-vs-outputs figure.
    Exit 1: the run does not verify, or a stage has more infra errors than the findings threshold
    (evaluate.max_infra_error_fraction; one line names the stage, the count and the threshold);
    2: no such run, or its plan names no findings."""
    import json
    import subprocess

    from flows.published_findings import ARMS_FILE, finding_rows
    from schemas import ArtifactStore
    from tasks.analysis.infra import InfraThresholdError
    from tasks.evaluate.seal import SealError
    from tasks.evaluate.verify import NotARunError

    if config is not None and _is_talkmesh_config(config):
        _talkmesh_findings(config, run_dir, set_, quick, append)
        return
    cfg = _config_or_exit(config, set_, None, quick=quick)
    rd = run_dir or Path(cfg.run_root) / f"{cfg.name}-{cfg.config_hash()[:10]}"
    if not rd.is_dir():
        typer.secho(f"NOT A RUN: {rd}: no such folder (run it first: harnessrl run -c {config or DEFAULT_CONFIG})",
                    fg="red", err=True)
        raise typer.Exit(2)
    from tasks.evaluate.plan import evaluate_config_hash

    store = ArtifactStore(rd)
    if store.exists("evaluate/evaluations.manifest.json") and \
            store.manifest("evaluate", "evaluations").get("config_hash") != evaluate_config_hash(cfg):
        typer.secho(f"NOT THIS RUN: {rd}: its evaluation was made with another config than {config or DEFAULT_CONFIG} "
                    "(pass the same --set and --quick as the run)", fg="red", err=True)
        raise typer.Exit(2)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    try:
        rows = finding_rows(store, config=str(config or DEFAULT_CONFIG) + (" --quick" if quick else ""),
                            config_hash=cfg.config_hash(), commit=commit or "unknown")
    except NotARunError as e:
        typer.secho(f"NOT A RUN: {e}", fg="red", err=True)
        raise typer.Exit(2)
    except InfraThresholdError as e:
        typer.secho(f"NOT PUBLISHED: {rd}: {e}", fg="red", err=True)
        raise typer.Exit(1)
    except SealError as e:
        typer.secho(f"NOT VERIFIED: {e}", fg="red", err=True)
        raise typer.Exit(2 if "names no findings" in str(e) else 1)
    lines = [json.dumps(r, sort_keys=True) for r in rows]
    for line in lines:
        typer.echo(line)
    if append is not None:
        with append.open("a") as fh:
            fh.write("".join(line + "\n" for line in lines))
        typer.echo(f"appended {len(lines)} row(s) to {append}")
        from flows.published_findings import arm_rows, copy_figures

        label = f"{cfg.name}-{cfg.config_hash()[:10]}"
        arms = arm_rows(store, cfg, label)
        if arms:
            arms_file = append.parent / ARMS_FILE
            with arms_file.open("a") as fh:
                fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in arms))
            typer.echo(f"appended {len(arms)} arm row(s) to {arms_file}")
        for p in copy_figures(rd, Path("docs/img/findings"), label):
            typer.echo(f"figure for the findings page: {p}")


def _is_talkmesh_config(config: Path) -> bool:
    """Whether the YAML file has a top-level ``talkmesh`` section (a ``harnessrl talkmesh`` config)."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return False  # the ordinary loader reports the file's problem
    return isinstance(data, dict) and "talkmesh" in data


def _talkmesh_findings(config: Path, run_dir: Optional[Path], set_: list[str], quick: bool,
                       append: Optional[Path]) -> None:
    """``harnessrl findings`` for a ``harnessrl talkmesh`` run: the run's seal verified
    (:func:`tasks.talkmesh.seal.verify_talkmesh`), then its pre-registered findings as rows with the
    signer's fingerprint (:func:`tasks.talkmesh.findings.published_rows`); a run made before TalkMesh
    runs were sealed (no ``talkmesh/plan.json``) gives rows marked ``sealed: false``. With
    ``append``, the rows go to that file and the accuracy-vs-outputs figure to docs/img/findings/.
    Exit 1: the seal does not verify; 2: no such run, another config's run, or no findings table."""
    import json
    import shutil
    import subprocess

    from flows.naming import run_label
    from flows.status import STATE_DIR
    from schemas import ArtifactStore
    from tasks.config import ConfigError
    from tasks.talkmesh.config import load_talkmesh_config
    from tasks.talkmesh.findings import published_rows

    try:
        cfg = load_talkmesh_config(config, _parse_sets(set_), quick=quick)
    except ConfigError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    rd = run_dir or Path(cfg.run_root) / run_label(cfg)
    store = ArtifactStore(rd)
    if not store.exists("talkmesh/talkmesh_findings.manifest.json"):
        typer.secho(f"NOT A RUN: {rd}: no talkmesh/talkmesh_findings table (run it first: harnessrl talkmesh -c "
                    f"{config}{' --quick' if quick else ''}; the config must set talkmesh.findings)", fg="red", err=True)
        raise typer.Exit(2)
    if store.manifest("talkmesh", "talkmesh_findings").get("config_hash") != \
            cfg.section_hash("policy", "train", "talkmesh", "suites", "split"):
        typer.secho(f"NOT THIS RUN: {rd}: its tables were made with another config than {config} (pass the same "
                    "--set and --quick as the run)", fg="red", err=True)
        raise typer.Exit(2)
    from tasks.talkmesh.seal import PLAN as TALKMESH_PLAN, verify_talkmesh

    fp = None
    if store.exists(TALKMESH_PLAN):  # sealed: the rows are published only once the run verifies
        from tasks.evaluate.seal import SealError

        try:
            fp = verify_talkmesh(store).fingerprint
        except SealError as e:
            typer.secho(f"VERIFY FAILED: {rd}: {e}", fg="red", err=True)
            raise typer.Exit(1)
    freeze = store.read_json(f"{STATE_DIR}/freeze.json") if store.exists(f"{STATE_DIR}/freeze.json") else {}
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = published_rows(store, config=str(config) + (" --quick" if quick else ""), config_hash=cfg.config_hash(),
                          commit=commit or "unknown", freeze_seconds=freeze.get("compute_seconds"), key_fingerprint=fp)
    lines = [json.dumps(r, sort_keys=True) for r in rows]
    for line in lines:
        typer.echo(line)
    if fp is None:
        typer.secho("not sealed: this run has no talkmesh/plan.json (made before harnessrl talkmesh sealed its runs), "
                    "so harnessrl verify cannot recompute these rows (each says sealed: false)", fg="yellow", err=True)
    else:
        typer.echo(f"verified: the sealed rows recompute the findings table; signed by {fp}")
    if append is not None:
        with append.open("a") as fh:
            fh.write("".join(line + "\n" for line in lines))
        typer.echo(f"appended {len(lines)} row(s) to {append}")
        src = rd / "talkmesh" / "accuracy_vs_outputs.png"
        if src.is_file():
            dst = Path("docs/img/findings") / f"{run_label(cfg)}--accuracy_vs_outputs.png"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            typer.echo(f"figure for the findings page: {dst}")


@app.command()
def status(run_dir: str = typer.Argument(..., help="a run folder or fsspec URL (file://, s3://, ...)")) -> None:
    """A run's stages (done / failed / cancelled / interrupted / corrupt / missing), each artifact's SHA-256, rows and
    creation time, and the pass rates. Exit 2: not a run; exit 1: an artifact differs from its manifest."""
    from rich.console import Console

    from flows.status import NotARunError, pass_rates, render, run_status
    from schemas import ArtifactError, ArtifactStore

    if "://" not in run_dir and not Path(run_dir).is_dir():
        typer.secho(f"{run_dir}: no such run folder", fg="red", err=True)
        raise typer.Exit(2)
    try:
        store = ArtifactStore(run_dir)
        stages = run_status(store)
        rates = pass_rates(store) if not any(s.state == "corrupt" for s in stages) else []
    except NotARunError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    except (ArtifactError, OSError) as e:
        typer.secho(f"{run_dir}: cannot read the run: {e}", fg="red", err=True)
        raise typer.Exit(2)
    render(store, stages, rates, Console(width=max(Console().width, 120)))
    if any(s.state == "corrupt" for s in stages):
        raise typer.Exit(1)


@app.command()
def deploy(
    names: list[str] = typer.Argument(None, help="deployments to register (default: all in prefect.yaml)"),
    file: Path = typer.Option(REPO_ROOT / "prefect.yaml", "--file", "-f", help="the prefect.yaml to read"),
) -> None:
    """Register prefect.yaml's deployments (pipeline and each stage, config path as a parameter, cron
    schedule) with the Prefect API at PREFECT_API_URL, creating their process work pool."""
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            typer.secho("PREFECT_API_URL is not set: start a server (prefect server start, or infra/compose.yaml) and "
                        "export PREFECT_API_URL=http://HOST:4200/api", fg="red", err=True)
            raise typer.Exit(2)
    from rich.console import Console

    from flows.deploy import register, summary_table

    try:
        rows = register(file, names or None)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    Console(width=max(Console().width, 120)).print(summary_table(rows))
    typer.echo(f"start a worker:  prefect worker start --pool {rows[0]['work_pool']} --type process")
    typer.echo(f"run one now:     prefect deployment run '{rows[0]['deployment']}' -p config=configs/default.yaml")


@app.command("kl-check")
def kl_check(
    out: Path = typer.Option(Path("runs/kl-check"), "--out", help="folder for kl_check/kl_check.parquet"),
    samples: int = typer.Option(4096, "--samples", "-n", help="Monte-Carlo samples per configuration"),
    seed: int = typer.Option(0, "--seed"),
    vocab: int = typer.Option(3, "--vocab", min=2, max=5),
    length: int = typer.Option(3, "--length", min=1, max=5),
) -> None:
    """P5's table, checked by enumeration: each KL (estimator, placement)'s gradient bias against
    the exact gradient of the sequence-level reverse KL, with a Monte-Carlo estimate beside it."""
    from rich.console import Console
    from rich.table import Table

    from schemas import ArtifactStore
    from tasks.train.kl_check import kl_check_table

    rows = kl_check_table(vocab=vocab, length=length, samples=samples, seed=seed)
    t = Table(title=f"gradient of KL(pi || pi_ref), vocabulary {vocab}, length {length}: exact vs each estimator")
    for col in ("configuration", "bias norm", "rel. bias", "unbiased", "token-level unbiased",
                f"MC error (N={samples})", "MC std. error", "paper says", "agrees"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["configuration"], f"{r['bias_norm']:.2e}", f"{r['relative_bias']:.3f}",
                  "yes" if r["unbiased"] else "no", "yes" if r["token_level_unbiased"] else "no",
                  f"{r['mc_error_norm']:.3e}", f"{r['mc_se_norm']:.3e}",
                  "unbiased" if r["paper_unbiased"] else "biased", "yes" if r["agrees_with_paper"] else "NO")
    Console(width=max(Console().width, 132)).print(t)
    typer.echo("stale = samples from an older policy; stale-is = importance-weighted by pi_theta(y) / pi_old(y)")
    ref = ArtifactStore(out).write("kl_check", "kl_check", rows, config_hash="")
    typer.echo(f"wrote {out / ref.path} ({ref.rows} rows, sha256 {ref.sha256[:16]})")
    if not all(r["agrees_with_paper"] for r in rows):
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    app(prog_name="harnessrl")


@app.command("bipa")
def bipa(
    config: Path = typer.Option(..., "--config", "-c", help="a BiPA run config (e.g. configs/bipa-small.yaml)"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="run folder (default RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="override a config key, e.g. --set bipa.candidates=2"),
) -> None:
    """P2 (BiPA): optimise a harness's skill, replay the acceptance rule on fresh and test episodes,
    build the episode graph; artifacts and bipa/report.md in the run folder."""
    from tasks.bipa.config import load_bipa_config
    from tasks.config import ConfigError

    try:
        cfg = load_bipa_config(config, _parse_sets(set_))
    except ConfigError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    _run_experiment(cfg, run_dir, "bipa")


def _run_experiment(cfg: Any, run_dir: Optional[Path], name: str) -> None:
    """Run ``flows.<name>.<name>_flow`` (a command of its own beside the pipeline: ``bipa``,
    ``talkmesh``) in ``run_dir`` (default RUN_ROOT/NAME-CONFIGHASH), then print its
    ``<name>/report.md``, the run folder and the wall time."""
    import importlib

    from flows.naming import run_label, tagged

    rd = run_dir or Path(cfg.run_root) / run_label(cfg)
    rd.mkdir(parents=True, exist_ok=True)
    prepare_environment(Path(cfg.run_root))
    _quiet_libraries()
    run_flow = getattr(importlib.import_module(f"flows.{name}"), f"{name}_flow")
    from flows.server import start_temporary_server
    from flows.stopping import stop_on_signals

    t0 = time.perf_counter()
    with stop_on_signals(f"harnessrl {name}"):  # SIGTERM / SIGINT: cancelled, exit 143 / 130 (see `run`)
        start_temporary_server()
        with _settled_server(), tagged(cfg):
            run_flow(cfg, str(rd))
    typer.echo((rd / name / "report.md").read_text())
    typer.echo(f"run folder: {rd.resolve()}\ntotal: {time.perf_counter() - t0:.1f} s")


@app.command("talkmesh")
def talkmesh(
    config: Path = typer.Option(..., "--config", "-c", help="a TalkMesh run config (e.g. configs/talkmesh-small.yaml)"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="run folder (default RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="override a config key, e.g. --set talkmesh.agents=4"),
    quick: bool = typer.Option(False, "--quick", help="apply the config's own `quick` section first (a smaller run)"),
) -> None:
    """P3 (TalkMesh): confidence head, talk-policy GRPO, the mesh against majority and
    confidence-weighted vote, collusion; tables, talkmesh/report.md and a plot in the run folder.
    A config with talkmesh.findings also gets the pre-registered findings (then: harnessrl findings)."""
    from tasks.config import ConfigError
    from tasks.talkmesh.config import load_talkmesh_config

    try:
        cfg = load_talkmesh_config(config, _parse_sets(set_), quick=quick)
    except ConfigError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    _run_experiment(cfg, run_dir, "talkmesh")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
