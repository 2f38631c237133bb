"""TalkMesh's hooks into the commands: ``harnessrl verify`` on a sealed ``harnessrl talkmesh`` run
and ``harnessrl findings`` for a TalkMesh config (registered in :mod:`tasks.talkmesh.application`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.command import CommandError, Say

# the tables a TalkMesh run recomputes (their manifests say which machine wrote them)
TALKMESH_TABLES = ("talkmesh/talkmesh_findings", "talkmesh/talkmesh_curves")


def owns_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run sealed by ``harnessrl talkmesh``: its own plan and no evaluation
    plan (its freeze still signs the pre-registration, so an ``evaluate/`` folder with the public
    key may exist)."""
    from tasks.talkmesh.seal import PLAN

    return (run_dir / PLAN).is_file() and not (run_dir / "evaluate" / "plan.json").is_file()


def recompute_note(store: Any) -> str | None:
    """``harnessrl verify``'s line when the TalkMesh tables were written on another numpy kernel
    (:func:`tasks.evaluate.verify.recompute_note`); None when the kernels are the same."""
    from tasks.evaluate.verify import recompute_note as note

    return note(store, TALKMESH_TABLES, exact=("talkmesh_findings and talkmesh_curves use no BLAS or libm (float64 "
                                               "sums, sorts, seeded draws) and are still compared exactly"))


def verify(store: Any, public_key: bytes | None = None) -> Any:
    """:func:`tasks.talkmesh.seal.verify_talkmesh`."""
    from tasks.talkmesh.seal import verify_talkmesh

    return verify_talkmesh(store, public_key=public_key)


def claims_config(data: dict[str, Any]) -> bool:
    """Whether a YAML mapping is a ``harnessrl talkmesh`` config (a top-level ``talkmesh`` section)."""
    return "talkmesh" in data


def findings(store: Any, cfg: Any, *, config: str, quick: bool, commit: str, freeze_seconds: float | None,
             say: Say) -> tuple[list[dict[str, Any]], list[Path]]:
    """``harnessrl findings`` for a ``harnessrl talkmesh`` run: the run's seal verified
    (:func:`tasks.talkmesh.seal.verify_talkmesh`), then its pre-registered findings as rows with the
    signer's fingerprint (:func:`tasks.talkmesh.findings.published_rows`), printed through ``say``
    one JSON line each, then one line on the seal; a run made before TalkMesh runs were sealed (no
    ``talkmesh/plan.json``) gives rows marked ``sealed: false``.

    Returns ``(rows, figures)``: the figures (paths in the run folder) for the findings page.

    Raises:
        CommandError: exit 1: the seal does not verify; 2: no findings table, another config's run.
    """
    import json

    from tasks.evaluate.seal import SealError
    from tasks.talkmesh.findings import published_rows
    from tasks.talkmesh.seal import PLAN, verify_talkmesh

    label = config + (" --quick" if quick else "")
    if not store.exists("talkmesh/talkmesh_findings.manifest.json"):
        raise CommandError(f"NOT A RUN: {store.url}: no talkmesh/talkmesh_findings table (run it first: harnessrl "
                           f"talkmesh -c {label}; the config must set talkmesh.findings)", 2)
    if store.manifest("talkmesh", "talkmesh_findings").get("config_hash") != \
            cfg.section_hash("policy", "train", "talkmesh", "suites", "split"):
        raise CommandError(f"NOT THIS RUN: {store.url}: its tables were made with another config than {config} (pass "
                           "the same --set and --quick as the run)", 2)
    fp = None
    if store.exists(PLAN):  # sealed: the rows are published only once the run verifies
        try:
            fp = verify_talkmesh(store).fingerprint
        except SealError as e:
            raise CommandError(f"VERIFY FAILED: {store.url}: {e}", 1) from None
    rows = published_rows(store, config=label, config_hash=cfg.config_hash(), commit=commit,
                          freeze_seconds=freeze_seconds, key_fingerprint=fp)
    for r in rows:
        say(json.dumps(r, sort_keys=True))
    if fp is None:
        say("not sealed: this run has no talkmesh/plan.json (made before harnessrl talkmesh sealed its runs), so "
            "harnessrl verify cannot recompute these rows (each says sealed: false)", "yellow", True)
    else:
        say(f"verified: the sealed rows recompute the findings table; signed by {fp}")
    return rows, [Path(store.url) / "talkmesh" / "accuracy_vs_outputs.png"]
