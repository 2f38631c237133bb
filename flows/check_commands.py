"""The logic of the commands that check a finished run: ``harnessrl verify`` (recompute its seal)
and ``harnessrl findings`` (verify it and print its findings rows). A run sealed by an application
(:mod:`tasks.registries.applications`: ``owns_run``, ``verify``, ``claims_config``, ``findings``)
is checked by that application's hooks; the command line reaches them only through here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.command import CommandError, Say


def _owner(run_dir: Path) -> Any:
    from tasks.registries.applications import applications

    return next((a for a in applications() if a.owns_run is not None and a.owns_run(run_dir)), None)


def read_public_key(public_key: Path | None) -> bytes | None:
    """The bytes of ``--public-key`` (an Ed25519 public key in PEM), or None.

    Raises:
        CommandError: unreadable, or not such a key (2).
    """
    if public_key is None:
        return None
    try:
        expected = public_key.read_bytes()
    except OSError as e:
        raise CommandError(f"--public-key={str(public_key)!r}: cannot be read ({e.strerror})", 2) from None
    from tasks.evaluate.signing import fingerprint

    try:
        fingerprint(expected)
    except ValueError as e:
        raise CommandError(f"--public-key={str(public_key)!r}: not an Ed25519 public key in PEM ({e})", 2) from None
    return expected


def verify_command(run_dir: Path, public_key: Path | None, witness: bool, findings_file: Path | None,
                   say: Say) -> None:
    """``harnessrl verify``: recompute the run's sealed evaluation (or an application's own seal)
    and its signatures; with ``witness`` compare plan hash and head with the Prefect API's
    artifacts; with ``findings_file`` its published rows. Prints ``verified: ...`` at the end.

    Raises:
        CommandError: 2: not a run, a bad key, no Prefect API; 1: tampered (the first difference).
    """
    from schemas import ArtifactError, ArtifactStore
    from tasks.evaluate.exports import check_inspect_logs
    from tasks.evaluate.seal import SealError
    from tasks.evaluate.verify import NotARunError, recompute_note, verify_run

    if not run_dir.is_dir():
        raise CommandError(f"NOT A RUN: {run_dir}: no such folder", 2)
    expected = read_public_key(public_key)
    app = _owner(run_dir)  # a run sealed by an application's own plan, not the evaluate stage's
    if app is not None and (witness or findings_file is not None):
        raise CommandError(f"{'--witness' if witness else '--findings'}: not built for a {app.title or app.name} run (harnessrl "
                           f"{app.name} records no witness and its findings rows are checked by harnessrl findings)", 2)
    store = ArtifactStore(run_dir)
    if app is None:
        note = recompute_note(store)
    else:
        note = app.recompute_note(store) if app.recompute_note is not None else None
    if note:  # another CPU or numpy kernel than the one that wrote the statistics: say what is exact
        say(note, "yellow")
    try:
        if app is not None:
            rep = app.verify(store, expected)
        else:
            rep = verify_run(store, public_key=expected)
            check_inspect_logs(str(run_dir), strict=True)  # the Inspect logs against the sealed rows (SealError)
        if witness:
            from tasks.evaluate.witness import check_witness

            try:
                seen = check_witness(rep.plan_hash, rep.head)
            except RuntimeError as e:
                raise CommandError(f"--witness: no Prefect API answers ({type(e).__name__}: {e})", 2) from None
            say(f"witnessed by the Prefect API: plan at {seen['plan']}, head at {seen['head']}")
        if findings_file is not None:
            from flows.published_findings import check_published

            got = check_published(store, findings_file, run_dir.resolve().name.rsplit("-", 1)[-1],
                                  plan_hash=rep.plan_hash, fingerprint=rep.fingerprint)
            say(f"{findings_file}: {got.compared} row(s) of this run recomputed and equal"
                + (f"; {got.other_runs} row(s) of the same config from another run (another sealed plan or signing "
                   "key) not compared" if got.other_runs else ""))
    except NotARunError as e:
        raise CommandError(f"NOT A RUN: {e}", 2) from None
    except (SealError, ArtifactError, KeyError, ValueError) as e:
        raise CommandError(f"VERIFY FAILED: {e}", 1) from None
    say(f"verified: plan {rep.plan_hash[:16]}, {rep.rows} sealed rows, head {rep.head[:16]}, signed by "
        f"{rep.fingerprint}", "green")


def config_owner(config: Path | None) -> Any:
    """The application whose config ``config`` is (its ``claims_config`` says so of the YAML
    mapping), or None (the pipeline's config, or a file the ordinary loader will report on)."""
    if config is None:
        return None
    import yaml

    from tasks.registries.applications import applications

    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return None  # the ordinary loader reports the file's problem
    if not isinstance(data, dict):
        return None
    return next((a for a in applications() if a.claims_config is not None and a.claims_config(data)), None)


def _commit() -> str:
    import subprocess

    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()


def _append(append: Path, rows: list[dict[str, Any]], say: Say) -> None:
    with append.open("a") as fh:
        fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    say(f"appended {len(rows)} row(s) to {append}")


def application_findings(app: Any, cfg: Any, config: Path, run_dir: Path | None, quick: bool, append: Path | None,
                         say: Say) -> None:
    """``harnessrl findings`` for an application's config: its ``findings`` hook prints the rows
    (and the seal's line); with ``append`` they go to that file and its figures to
    docs/img/findings/ (``<run label>--<figure>``)."""
    import shutil

    from flows.naming import run_label
    from flows.status import STATE_DIR
    from schemas import ArtifactStore

    rd = run_dir or Path(cfg.run_root) / run_label(cfg)
    store = ArtifactStore(rd)
    freeze = store.read_json(f"{STATE_DIR}/freeze.json") if store.exists(f"{STATE_DIR}/freeze.json") else {}
    rows, figures = app.findings(store, cfg, config=str(config), quick=quick, commit=_commit() or "unknown",
                                 freeze_seconds=freeze.get("compute_seconds"), say=say)
    if append is not None:
        _append(append, rows, say)
        for src in figures:
            if src.is_file():
                dst = Path("docs/img/findings") / f"{run_label(cfg)}--{src.name}"
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                say(f"figure for the findings page: {dst}")


def pipeline_findings(cfg: Any, config_name: str, run_dir: Path | None, quick: bool, append: Path | None,
                      say: Say) -> None:
    """``harnessrl findings`` for a pipeline run: verify it, print its findings rows
    (:func:`flows.published_findings.finding_rows`); with ``append`` add them (and the arms' rows) to that
    file and copy the run's figures to docs/img/findings/.

    Raises:
        CommandError: 2: no such run, another config's run, its plan names no findings; 1: it does
            not verify, or a stage has more infra errors than the findings threshold.
    """
    from flows.published_findings import (ARMS_FILE, P1_CORRELATIONS_FILE, arm_rows, copy_figures, finding_rows,
                                          p1_correlation_rows)
    from schemas import ArtifactStore
    from tasks.analysis.infra import InfraThresholdError
    from tasks.evaluate.p1_correlations import markdown_table
    from tasks.evaluate.plan import evaluate_config_hash
    from tasks.evaluate.seal import SealError
    from tasks.evaluate.verify import NotARunError

    rd = run_dir or Path(cfg.run_root) / f"{cfg.name}-{cfg.config_hash()[:10]}"
    if not rd.is_dir():
        raise CommandError(f"NOT A RUN: {rd}: no such folder (run it first: harnessrl run -c {config_name})", 2)
    store = ArtifactStore(rd)
    if store.exists("evaluate/evaluations.manifest.json") and \
            store.manifest("evaluate", "evaluations").get("config_hash") != evaluate_config_hash(cfg):
        raise CommandError(f"NOT THIS RUN: {rd}: its evaluation was made with another config than {config_name} "
                           "(pass the same --set and --quick as the run)", 2)
    try:
        rows = finding_rows(store, config=config_name + (" --quick" if quick else ""),
                            config_hash=cfg.config_hash(), commit=_commit() or "unknown")
    except NotARunError as e:
        raise CommandError(f"NOT A RUN: {e}", 2) from None
    except InfraThresholdError as e:
        raise CommandError(f"NOT PUBLISHED: {rd}: {e}", 1) from None
    except SealError as e:
        raise CommandError(f"NOT VERIFIED: {e}", 2 if "names no findings" in str(e) else 1) from None
    for r in rows:
        say(json.dumps(r, sort_keys=True))
    label = f"{cfg.name}-{cfg.config_hash()[:10]}"
    corr = p1_correlation_rows(store, label, rows[0]["plan_hash"] if rows else None)
    if corr:  # P1's R^2 and rank correlations over the p1 findings' cells (descriptive, no verdict)
        say(markdown_table(corr).rstrip("\n"))
    if append is not None:
        _append(append, rows, say)
        if corr:
            with (append.parent / P1_CORRELATIONS_FILE).open("a") as fh:
                fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in corr))
            say(f"appended {len(corr)} P1 correlation row(s) to {append.parent / P1_CORRELATIONS_FILE}")
        arms = arm_rows(store, cfg, label)
        if arms:
            arms_file = append.parent / ARMS_FILE
            with arms_file.open("a") as fh:
                fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in arms))
            say(f"appended {len(arms)} arm row(s) to {arms_file}")
        for p in copy_figures(rd, Path("docs/img/findings"), label):
            say(f"figure for the findings page: {p}")
