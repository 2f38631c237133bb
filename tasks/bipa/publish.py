"""BiPA's hooks into the commands: ``harnessrl verify`` on a sealed ``harnessrl bipa`` run and
``harnessrl findings`` for a BiPA config (registered in :mod:`tasks.bipa.application`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.command import CommandError, Say

BIPA_TABLES = ("bipa/bipa_findings", "bipa/bipa_gains")


def owns_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run sealed by ``harnessrl bipa`` (its own ``bipa/plan.json``)."""
    from tasks.bipa.sealed_run import PLAN

    return (run_dir / PLAN).is_file() and not (run_dir / "evaluate" / "plan.json").is_file()


def recompute_note(store: Any) -> str | None:
    """``harnessrl verify``'s line when the BiPA tables were written on another numpy kernel."""
    from tasks.evaluate.verify import recompute_note as note

    return note(store, BIPA_TABLES, exact=("bipa_findings and bipa_gains use no BLAS or libm (float64 sums, sorts, "
                                           "seeded draws) and are still compared exactly"))


def verify(store: Any, public_key: bytes | None = None) -> Any:
    """:func:`tasks.bipa.sealed_run.verify_bipa`."""
    from tasks.bipa.sealed_run import verify_bipa

    return verify_bipa(store, public_key=public_key)


def claims_config(data: dict[str, Any]) -> bool:
    """Whether a YAML mapping is a ``harnessrl bipa`` config (a top-level ``bipa`` section)."""
    return "bipa" in data


def published_rows(store: Any, *, config: str, config_hash: str, commit: str, key_fingerprint: str,
                   plan_hash: str, wall_s: float | None) -> list[dict[str, Any]]:
    """One ``findings.jsonl`` row per ``bipa_findings`` row of a verified run: the finding's fields
    (estimate, interval, level, n, verdict, reason, the placebo as ``control`` with its interval),
    the placebo's gains by set (``placebo``), and ``config``, ``config_hash``, ``commit``,
    ``key_fingerprint``, ``plan_hash``, ``sealed`` (True), ``wall_s`` and the infra fields of
    :func:`infra_fields`."""
    infra = infra_fields(store)
    plac = next((g for g in store.rows(("bipa", "bipa_gains")) if g["arm"] == "placebo"), None)
    placebo = None if plac is None else {s: plac[f"gain_{s}"] for s in ("selection", "fresh", "test")}
    keep = ("paper", "name", "headline", "measure", "arm", "score_set", "claim", "margin", "estimate", "ci_low",
            "ci_high", "level", "n", "n_candidates", "optimizer_seeds", "interval", "control", "control_ci_low",
            "control_ci_high", "rule", "verdict", "reason")
    out = []
    for f in store.rows(("bipa", "bipa_findings")):
        out.append({**{k: f[k] for k in keep}, "learned": json.loads(f["learned"]), "placebo": placebo,
                    "config": config, "config_hash": config_hash, "commit": commit, "key_fingerprint": key_fingerprint,
                    "plan_hash": plan_hash, "sealed": True, "wall_s": wall_s, **infra})
    return out


def infra_fields(store: Any) -> dict[str, Any]:
    """The infra-error fields of a findings row (:func:`tasks.analysis.infra.row_fields`) for a
    sealed BiPA run: one stage, ``bipa``, counting its sealed episodes whose status is
    ``infra_error`` (scored 0 by the run) out of all its sealed episodes; threshold
    :data:`tasks.analysis.infra.DEFAULT_MAX_INFRA_ERROR_FRACTION`."""
    from tasks.analysis.infra import DEFAULT_MAX_INFRA_ERROR_FRACTION

    status = [r["status"] for r in store.raw_rows("bipa", "bipa_sealed") if r["kind"] == "episode"]
    bad = sum(s == "infra_error" for s in status)
    return {"infra_errors": {"bipa": bad}, "infra_planned": {"bipa": len(status)}, "infra_total": bad,
            "infra_threshold": DEFAULT_MAX_INFRA_ERROR_FRACTION}


def findings(store: Any, cfg: Any, *, config: str, quick: bool, commit: str, freeze_seconds: float | None,
             say: Say) -> tuple[list[dict[str, Any]], list[Path]]:
    """``harnessrl findings`` for a ``harnessrl bipa`` run with ``bipa.findings``: the seal verified
    (:func:`tasks.bipa.sealed_run.verify_bipa`), then one JSON line per finding through ``say``
    and one on the seal. Returns ``(rows, figures)``: the figures of :func:`gains_figure`.

    Raises:
        CommandError: exit 1: the seal does not verify, or an episode ended ``infra_error`` (the
            threshold of docs/experiments/findings-rules.md, 0, for the one stage ``bipa``);
            2: no findings table (not run, or a config
            without ``bipa.findings``), or the tables were made with another config.
    """
    from tasks.bipa.sealed_run import verify_bipa
    from tasks.evaluate.seal import SealError

    label = config + (" --quick" if quick else "")
    if not store.exists("bipa/bipa_findings.manifest.json"):
        raise CommandError(f"NOT A RUN: {store.url}: no bipa/bipa_findings table (run it first: harnessrl bipa -c "
                           f"{label}; the config must set bipa.findings)", 2)
    if store.manifest("bipa", "bipa_findings").get("config_hash") != cfg.config_hash():
        raise CommandError(f"NOT THIS RUN: {store.url}: its tables were made with another config than {config} (pass "
                           "the same --set and --quick as the run)", 2)
    infra = infra_fields(store)
    if infra["infra_total"] > 0:
        raise CommandError(f"bipa: {infra['infra_total']} infra error(s) of {infra['infra_planned']['bipa']} episodes, "
                           "above the findings threshold of 0; fix the cause and rerun in a new run folder", 1)
    try:
        rep = verify_bipa(store)
    except SealError as e:
        raise CommandError(f"VERIFY FAILED: {store.url}: {e}", 1) from None
    timing = store.read_json("bipa/timing.json") if store.exists("bipa/timing.json") else {}
    wall = None if timing.get("seconds") is None else round(float(timing["seconds"]) + float(freeze_seconds or 0), 1)
    rows = published_rows(store, config=label, config_hash=cfg.config_hash(), commit=commit,
                          key_fingerprint=rep.fingerprint, plan_hash=rep.plan_hash, wall_s=wall)
    for r in rows:
        say(json.dumps(r, sort_keys=True))
    say(f"verified: the sealed rows recompute the findings table; signed by {rep.fingerprint}")
    return rows, gains_figure(store)


def gains_figure(store: Any) -> list[Path]:
    """The verified run's gains figure (:func:`tasks.bipa.findings_report.gains_png` of its
    ``bipa_gains``) written to ``bipa/plots/gains.png`` in the run folder; ``[that path]`` for a
    local store (the CLI copies it to the findings page), ``[]`` for a remote one or a table with no
    gain to draw."""
    from tasks.bipa.findings_report import gains_png

    png = gains_png(store.rows(("bipa", "bipa_gains")))
    if png is None:
        return []
    store.write_bytes("bipa/plots/gains.png", png)
    return [Path(store.root) / "bipa" / "plots" / "gains.png"] if store.is_local else []
