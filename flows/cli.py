"""``harnessrl``: the command line. It parses and dispatches; each command's logic lives in the
package it belongs to (:mod:`flows.run_commands`, :mod:`flows.check_commands`,
:mod:`flows.status`, :mod:`flows.deploy`, :mod:`tasks.train.kl_check_report`), and an application's
command (``harnessrl talkmesh``, ...) comes from the application registry
(:mod:`tasks.registries.applications`). Heavy imports (torch, prefect, great_expectations) happen
inside the commands, so ``--help`` stays fast."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from tasks.command import CommandError
from tasks.config.base import STAGES  # pydantic only: --help stays fast
from tasks.registries.applications import Application, applications

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="harnessrl: RL for LLM agents, with the harness measured apart from the model.")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = "configs/default.yaml"
FROM_HELP = f"force this stage and every later one ({', '.join(STAGES)})"
CONFIG_HELP = f"run config (default {DEFAULT_CONFIG})"
RUN_DIR_HELP = "run folder (default RUN_ROOT/NAME-CONFIGHASH)"


def say(text: str, color: Optional[str] = None, err: bool = False) -> None:
    """Print one line (``color``: a click colour; ``err``: to stderr)."""
    typer.secho(text, fg=color, err=err)


def dispatch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; a :class:`CommandError` becomes its line on stderr and its exit code."""
    try:
        return fn(*args, **kwargs)
    except CommandError as e:
        if e.message:
            typer.secho(e.message, fg=e.color, err=True)
        raise typer.Exit(e.code) from None


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


def _config_or_exit(config: Optional[Path], sets: list[str], from_stage: Optional[str], *, quick: bool = False,
                    load: Optional[Callable[..., Any]] = None) -> Any:
    """The run config of ``--config`` (loaded by ``load``, an application's ``load_config``, or the
    pipeline's loader) with ``--set`` overrides (and ``--quick``), and ``--from`` checked against
    the stages; a bad one is one red line and exit code 2."""
    from tasks.config import ConfigError, load_config

    try:
        cfg = load(config, _parse_sets(sets), quick) if load is not None else \
            load_config(_default_config_path(config), _parse_sets(sets), quick=quick)
    except ConfigError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2)
    if from_stage is not None and from_stage not in STAGES:
        typer.secho(f"--from {from_stage!r}: not a stage; stages are {', '.join(STAGES)}", fg="red", err=True)
        raise typer.Exit(2)
    return cfg


@app.command()
def run(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
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
    from flows.run_commands import refuse_torchrun, run_pipeline

    dispatch(refuse_torchrun)
    cfg = _config_or_exit(config, set_, from_stage, quick=quick)
    dispatch(run_pipeline, cfg, run_dir, from_stage)


@app.command("train")
def train_cmd(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
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
    from flows.run_commands import require_torchrun, train_distributed

    dispatch(require_torchrun)
    cfg = _config_or_exit(config, set_, from_stage)
    dispatch(train_distributed, cfg, str(config or DEFAULT_CONFIG), run_dir, from_stage, say)


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
    from flows.check_commands import verify_command

    dispatch(verify_command, run_dir, public_key, witness, findings_file, say)


@app.command()
def findings(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="the run folder (default RUN_ROOT/NAME-CONFIGHASH)"),
    set_: list[str] = typer.Option([], "--set", help="the same overrides the run was given"),
    quick: bool = typer.Option(False, "--quick", help="the run was made with --quick"),
    append: Optional[Path] = typer.Option(None, "--append", help="append the rows to this JSONL file (e.g. "
                                          "benchmarks/results/findings.jsonl)"),
) -> None:
    """Verify a finished run and print its findings as JSON rows (paper, headline, estimate, interval,
    verdict, control, config hash, commit, signing key, wall time); --append adds them to a file and
    copies the run's figures to docs/img/findings/ for the findings page. For an application's config
    (e.g. `harnessrl talkmesh`, P3) the run's own seal is verified and its pre-registered findings
    printed, with its figures.
    Exit 1: the run does not verify, or a stage has more infra errors than the findings threshold
    (evaluate.max_infra_error_fraction; one line names the stage, the count and the threshold);
    2: no such run, or its plan names no findings."""
    from flows.check_commands import application_findings, config_owner, pipeline_findings

    owner = config_owner(config)
    if owner is not None and owner.findings is not None:
        cfg = _config_or_exit(config, set_, None, quick=quick, load=owner.load_config)
        dispatch(application_findings, owner, cfg, config, run_dir, quick, append, say)
        return
    cfg = _config_or_exit(config, set_, None, quick=quick)
    dispatch(pipeline_findings, cfg, str(config or DEFAULT_CONFIG), run_dir, quick, append, say)


@app.command()
def status(run_dir: str = typer.Argument(..., help="a run folder or fsspec URL (file://, s3://, ...)")) -> None:
    """A run's stages (done / failed / cancelled / interrupted / corrupt / missing), each artifact's SHA-256, rows and
    creation time, and the pass rates. Exit 2: not a run; exit 1: an artifact differs from its manifest."""
    from flows.status import status_command

    dispatch(status_command, run_dir)


@app.command()
def deploy(
    names: list[str] = typer.Argument(None, help="deployments to register (default: all in prefect.yaml)"),
    file: Path = typer.Option(REPO_ROOT / "prefect.yaml", "--file", "-f", help="the prefect.yaml to read"),
) -> None:
    """Register prefect.yaml's deployments (pipeline and each stage, config path as a parameter, cron
    schedule) with the Prefect API at PREFECT_API_URL, creating their process work pool."""
    from flows.deploy import deploy_command

    dispatch(deploy_command, file, names, say)


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
    from tasks.train.kl_check_report import print_kl_check

    if not print_kl_check(out, samples, seed, vocab, length, say):
        raise typer.Exit(1)


def application_command(a: Application) -> Callable[..., None]:
    """The command ``harnessrl <a.name>``: load its config, run its flow
    (:func:`flows.run_commands.run_application`)."""

    def command(config: Path = typer.Option(..., "--config", "-c", help=a.config_help),
                run_dir: Optional[Path] = typer.Option(None, "--run-dir", help=RUN_DIR_HELP),
                set_: list[str] = typer.Option([], "--set", help=a.set_help),
                quick: bool = typer.Option(False, "--quick", hidden=not a.takes_quick, help="apply the config's own "
                                           "`quick` section first (a smaller run)")) -> None:
        from flows.run_commands import run_application

        if quick and not a.takes_quick:
            raise typer.BadParameter(f"harnessrl {a.name} takes no --quick")
        cfg = _config_or_exit(config, set_, None, quick=quick, load=a.load_config)
        dispatch(run_application, a.name, cfg, run_dir, say)

    command.__doc__ = a.help
    return command


for _a in applications():
    if _a.run is not None:
        app.command(_a.name)(application_command(_a))


def main() -> None:  # pragma: no cover
    app(prog_name="harnessrl")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
