"""``harnessrl verify``: recompute a run's sealed evaluation from its files.

Kept apart from :mod:`tasks.evaluate.stage` so that verifying imports neither the trainer nor the
rollout engine (torch and their native libraries): an auditor's check loads pyarrow, the
statistics and inspect-ai only.

Every artifact the evaluate stage writes is required, a missing one is a failure
(:class:`~tasks.evaluate.seal.SealError`): the sealed rows, both statistics tables (recomputed from
the rows and compared row by row), one Inspect log per (checkpoint, harness)
(:func:`tasks.evaluate.exports.check_inspect_logs`), and the SWE-bench-style exports, a
predictions and a report file per (checkpoint, harness, attempt), recomputed byte for byte
(:func:`tasks.evaluate.exports.swebench_files`). The Ed25519 signatures over the plan hash and the
chain head are required and checked (:mod:`tasks.evaluate.signing`), and so is the
pre-registration the plan names (:mod:`tasks.evaluate.prereg`).

**What is exact and what is within tolerance.** Every hash (plan, rows, checkpoint files, loop
states, the Parquet file against its manifest) and every export is checked as bytes, on any
machine. The statistics are recomputed from the sealed rows with numpy and Python in float64:
pairwise sums, elementwise IEEE operations, ``sqrt``, sorts, ``math.fsum`` and seeded PCG64 draws,
whose results do not depend on the CPU, with two exceptions (:data:`KERNEL_DEPENDENT`):
``eval_contrasts``' ``mdd`` (:class:`statistics.NormalDist`'s ``inv_cdf`` calls libm's ``log``)
and the estimate and interval of a ``p1_predictor_gap`` finding (``np.corrcoef`` is a BLAS dot,
summed in the order of the BLAS kernel: OpenBLAS's SkylakeX and Haswell kernels differ in the last
bit). When the manifests of the statistics tables record another CPU or numpy kernel than this
process's (or none: written before machines were recorded), :func:`recompute_note` says so in one
line and those values are compared within :data:`tasks.evaluate.seal.REL_TOL`; a p1 finding's
verdict and reason must then be the rule's on its recorded numbers (an interval end within
rounding of the margin may land on either side of it on another kernel); all others stay exact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from schemas import ArtifactError, ArtifactStore
from schemas.machine import describe, light_facts, numpy_kernel
from tasks.evaluate.seal import REL_TOL, SealError, VerifyReport, check_recomputed, floats_close, verify_chain
from tasks.evaluate.prereg import check_preregistration
from tasks.evaluate.signing import EVALUATE_SEAL, check_signatures
from tasks.hashing import sha256_dir
from tasks.rollout.loop_plugins import state_artifacts

PLAN = EVALUATE_SEAL.plan
PLAN_HASH = EVALUATE_SEAL.plan_hash
EVALUATIONS = "evaluate/evaluations.parquet"
STATS = ("eval_cells", "eval_contrasts")


P1_VALUES = ("estimate", "ci_low", "ci_high")
# Per recomputed table: which values' last bits depend on the machine's float kernels (expected
# row, column -> True), compared within REL_TOL when the recording machine differs
KERNEL_DEPENDENT: dict[str, Callable[[dict[str, Any], str], bool]] = {
    # min_detectable_difference: statistics.NormalDist.inv_cdf calls libm's log
    "eval_contrasts": lambda row, col: col == "mdd",
    # predictor_gap: np.corrcoef's covariance is a BLAS dot
    "eval_findings": lambda row, col: row.get("measure") == "p1_predictor_gap" and col in P1_VALUES,
}


def _p1_verdict_on_recorded_numbers(expected: dict[str, Any], got: dict[str, Any], rule: int = 1) -> dict[str, Any]:
    """A recomputed ``p1_predictor_gap`` finding row whose recorded estimate and interval are within
    tolerance of the recomputed ones, with the verdict and reason the rule gives on the *recorded*
    numbers: an interval end within rounding of the margin (a gap of 1e-16 against 0) may fall on
    either side of it on another BLAS kernel, so the recorded verdict must follow from the recorded
    numbers, and those from the rows. Any other row: unchanged."""
    from tasks.evaluate.findings import decide

    if expected.get("measure") != "p1_predictor_gap" or not all(floats_close(got.get(k), expected[k])
                                                                 for k in P1_VALUES):
        return expected
    v, why = decide({**expected, **{k: got[k] for k in P1_VALUES}}, rule)
    return {**expected, "verdict": v, "reason": why}


def stored_version(store: ArtifactStore, stage: str, name: str) -> int | None:
    """The contract version ``<stage>/<name>.parquet`` was written under (its Parquet metadata);
    None when the file has none or cannot be read (the row comparison then names what is wrong)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(pa.BufferReader(store.read_bytes(f"{stage}/{name}.parquet"))).metadata or {}
        return int(meta[b"harnessrl.version"])
    except (pa.ArrowInvalid, OSError, KeyError, ValueError):
        return None


def as_written(name: str, version: int | None, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recomputed rows of table ``name`` with only the columns of the contract version the stored
    file was written under, when that is an earlier one the contract still reads (a run written
    before a column existed is compared on its own columns); else unchanged."""
    from schemas import get_contract

    c = get_contract(name)
    if version is None or version == c.version or version not in c.older:
        return rows
    cols = c.older[version].names
    return [{k: r.get(k) for k in cols} for r in rows]


# The tables the pipeline's run recomputes (their manifests say which machine wrote them); an
# application's run names its own (tasks.registries.applications: recompute_note)
EVALUATE_TABLES = ("evaluate/eval_cells", "evaluate/eval_contrasts", "evaluate/eval_findings")


def recorded_machines(store: ArtifactStore, tables: tuple[str, ...]) -> list[dict[str, Any] | None]:
    """The ``machine`` block of each of ``tables``' manifests that exists (``"<stage>/<name>"``),
    None for a manifest written before machines were recorded or one that cannot be read."""
    out: list[dict[str, Any] | None] = []
    for t in tables:
        stage, name = t.split("/", 1)
        if store.exists(f"{t}.manifest.json"):
            try:
                out.append(store.manifest(stage, name).get("machine"))
            except (ArtifactError, ValueError, AttributeError):
                out.append(None)
    return out


def kernels_differ(store: ArtifactStore, tables: tuple[str, ...] = EVALUATE_TABLES) -> bool:
    """True when any of ``tables``' manifests records another numpy kernel
    (:func:`schemas.machine.numpy_kernel`: CPU, ISA flags, numpy SIMD and BLAS, libm) than this
    process runs, or records none."""
    here = numpy_kernel(light_facts())
    return any(numpy_kernel(m) != here for m in recorded_machines(store, tables))


def recompute_note(store: ArtifactStore, tables: tuple[str, ...] = EVALUATE_TABLES, exact: str | None = None
                   ) -> str | None:
    """One line for ``harnessrl verify`` when it recomputes on another machine than the one that
    wrote the statistics (see the module docstring), naming both and what is then checked exactly
    and what within tolerance; None when the kernels are the same.

    ``tables``: the recomputed tables (``"<stage>/<name>"``); ``exact``: for an application's run
    whose tables have no kernel-dependent value, the clause saying so (every value is then still
    compared exactly); None: the pipeline's evaluation."""
    if not kernels_differ(store, tables):
        return None
    here = numpy_kernel(light_facts())
    known = next((m for m in recorded_machines(store, tables) if m and numpy_kernel(m) != here), None)
    was = describe(known) if known else "an unrecorded machine (manifests written before machines were recorded)"
    head = (f"recorded on {was}, recomputing on {describe(light_facts())}: recomputed statistics may differ in the "
            "last bits; sealed hashes are checked as bytes")
    if exact is not None:
        return f"{head}; {exact}"
    return head + (", and so are the exports; eval_cells, eval_contrasts and eval_findings are compared value for "
                   f"value, except eval_contrasts' mdd (libm log) and a p1_predictor_gap finding's estimate and "
                   f"interval (a BLAS dot), compared to {REL_TOL:g} relative, its verdict by the rule on the recorded "
                   "numbers")


class NotARunError(ValueError):
    """The folder is not a run with a sealed evaluation, or its plan / rows cannot be read at all
    (``harnessrl verify`` exit 2); the message is one line naming the file and what is wrong."""


def read_sealed(store: ArtifactStore) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """``(plan, committed plan hash, rows)`` of a run, read without any check.

    Raises:
        NotARunError: ``evaluate/plan.json``, ``evaluate/plan.sha256`` or
            ``evaluate/evaluations.parquet`` missing, or not JSON / text / Parquet.
    """
    for rel in (PLAN, PLAN_HASH, EVALUATIONS):
        if not store.exists(rel):
            raise NotARunError(f"{store.url}: not a run with a sealed evaluation ({rel} is missing)")
    try:
        plan = store.read_json(PLAN)
    except (ValueError, UnicodeDecodeError) as e:
        raise NotARunError(f"{store.url}/{PLAN}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(plan, dict) or not {"records", "checkpoints", "attempts"} <= set(plan):
        raise NotARunError(f"{store.url}/{PLAN}: not an evaluation plan (no records/checkpoints/attempts)")
    try:
        committed = store.read_bytes(PLAN_HASH).decode("ascii").strip()
    except UnicodeDecodeError as e:
        raise NotARunError(f"{store.url}/{PLAN_HASH}: unreadable ({e})") from None
    try:
        rows = store.raw_rows("evaluate", "evaluations")
    except ArtifactError as e:
        raise NotARunError(str(e).splitlines()[0]) from None
    return plan, committed, rows


def _verify_stats(store: ArtifactStore, plan: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Recompute ``eval_cells``, ``eval_contrasts`` and, when the plan names findings,
    ``eval_findings`` from the verified rows and the plan (every bootstrap is seeded from the plan)
    and compare them with the files, row by row: exactly, but for the :data:`KERNEL_DEPENDENT`
    values when :func:`kernels_differ` (within tolerance)."""
    from tasks.evaluate.stats import cell_table, contrast_table

    for name in STATS:
        if not store.exists(f"evaluate/{name}.parquet"):
            raise SealError(f"evaluate/{name}.parquet: missing (the evaluation writes it; a sealed run has it)")
    cells = cell_table(rows, plan, plan["min_graded_fraction"])
    want = {"eval_cells": cells,
            "eval_contrasts": contrast_table(rows, plan, cells, alpha=plan["alpha"],
                                             resamples=plan["bootstrap_resamples"], power=plan["power"])}
    if plan.get("findings"):
        from tasks.evaluate.findings import finding_table

        if not store.exists("evaluate/eval_findings.parquet"):
            raise SealError("evaluate/eval_findings.parquet: missing (the plan names findings; a sealed run has it)")
        want["eval_findings"] = finding_table(rows, plan, want["eval_contrasts"])
    other = kernels_differ(store)
    for name, expected in want.items():
        try:
            got = store.raw_rows("evaluate", name)
        except ArtifactError as e:
            raise SealError(f"evaluate/{name}.parquet: {e}") from None
        version = stored_version(store, "evaluate", name)
        if name == "eval_findings" and plan.get("findings_rule", 1) >= 2 and version is not None and version < 2:
            raise SealError(f"evaluate/{name}.parquet: written as version {version}, but the plan's verdict rule "
                            f"{plan['findings_rule']} writes version 2 (the file was replaced)")
        expected = as_written(name, version, expected)
        if other and name == "eval_findings" and len(got) == len(expected):
            rule = int(plan.get("findings_rule", 1))
            expected = [_p1_verdict_on_recorded_numbers(e, g, rule) for e, g in zip(expected, got)]
        check_recomputed(f"evaluate/{name}.parquet", got, expected, KERNEL_DEPENDENT.get(name) if other else None)


def _verify_exports(store: ArtifactStore, plan: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The SWE-bench-style files, recomputed from the rows and compared byte for byte. The run's
    name (the files' prefix, not in the plan) is read off the first planned report file."""
    from tasks.evaluate.exports import EXPORT_DIR, _safe, swebench_files

    ck, h = plan["checkpoints"][0]["name"], plan["harnesses"][0]
    tail = _safe(f".{ck}.{h}.attempt0") + ".report.json"
    present = set(store.list_files(EXPORT_DIR))
    firsts = sorted(p for p in present if p.endswith(tail))
    if len(firsts) != 1:
        raise SealError(f"{EXPORT_DIR}: {len(firsts)} files named *{tail} (expected exactly one: the exports are "
                        "missing or were added to)")
    run_name = firsts[0].rsplit("/", 1)[-1][: -len(tail)]
    want = swebench_files(run_name, plan, rows)
    for rel, data in want.items():
        if rel not in present:
            raise SealError(f"{rel}: missing (the evaluation writes it)")
        if store.read_bytes(rel) != data:
            raise SealError(f"{rel}: differs from the file recomputed from the sealed rows")
    extra = sorted(present - set(want))
    if extra:
        raise SealError(f"{extra[0]}: not a file the evaluation writes ({len(extra)} extra file(s) in {EXPORT_DIR})")


def verify_run(store: ArtifactStore, public_key: bytes | None = None) -> VerifyReport:
    """Recompute the sealed evaluation of a run from its files: the plan hash, the checkpoint
    files, the loop-type states (an application's fitted state) the plan names, the hash chain, the Ed25519
    signatures over the plan hash and the chain head (:func:`tasks.evaluate.signing.check_signatures`;
    ``public_key``: the expected public key, PEM, which the run's must equal; None: the run's own),
    the statistics tables (exactly, or within tolerance for the few kernel-dependent values when
    the recording machine differs: the module docstring) and the exports; the Inspect logs are checked
    by :func:`tasks.evaluate.exports.check_inspect_logs`. The returned report's ``fingerprint`` is
    the signing key's.

    Raises:
        NotARunError: not a run, or its plan / rows unreadable (see :func:`read_sealed`).
        SealError: the plan, a checkpoint's files, a row, a statistics table or an export changed
            or is missing (the message names the first difference).
    """
    plan, committed, rows = read_sealed(store)

    def ck_sha(ck: dict[str, Any]) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            return sha256_dir(store.get_dir(ck["path"], Path(tmp) / "ck"))

    report = verify_chain(plan, committed, rows, checkpoint_sha=ck_sha)
    fp = check_signatures(store, report.plan_hash, report.head, public_key)
    check_preregistration(store, plan)
    # the fitted states a plugged-in loop type's attempts ran with (e.g. a confidence head that
    # scored its agents); plans sealed before "loop_states" name such a state at top level, beside
    # the plan's own keys: each registered plugin's state artifact is looked up there too
    states = dict(plan.get("loop_states") or {})
    for name in state_artifacts():
        if name in plan:
            states[name] = plan[name]
    for name, state in sorted(states.items()):
        now = hashlib.sha256(store.read_bytes(state["path"])).hexdigest()
        if now != state["sha256"]:
            raise SealError(f"{state['path']}: SHA-256 {now[:16]}... != planned {state['sha256'][:16]}... (the {name} "
                            "the attempts ran with changed after the evaluation was sealed)")
    _verify_stats(store, plan, rows)
    _verify_exports(store, plan, rows)
    try:
        manifest = store.manifest("evaluate", "evaluations")
    except (ArtifactError, json.JSONDecodeError) as e:
        raise SealError(f"evaluate/evaluations.manifest.json: {e}") from None
    file_sha = hashlib.sha256(store.read_bytes(EVALUATIONS)).hexdigest()
    if file_sha != manifest.get("sha256"):
        raise SealError(f"{EVALUATIONS}: SHA-256 {file_sha[:16]}... differs from its manifest")
    return dataclasses.replace(report, fingerprint=fp)
