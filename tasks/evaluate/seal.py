"""Sealing: an evaluation plan hashed before any attempt runs, result rows in a hash chain.

- The plan (records, checkpoints with their adapter SHA-256s, harnesses, attempts, seeds) is
  written as canonical JSON; ``plan_hash = sha256(plan)``.
- Row i carries ``prev_hash`` (the plan hash for i = 0, else row i-1's ``seal_hash``) and
  ``seal_hash = sha256([prev_hash, payload_i])``, where ``payload_i`` is every other column.
- :func:`verify_chain` recomputes all of it from the files: a flipped reward, a dropped, added or
  reordered row, an edited plan or a swapped checkpoint file breaks it at a named row.
- A retry of an ``infra_error`` attempt is a new row (``retry`` = 1, 2, ...) whose ``retry_of``
  is the eval_id of the earlier row it retries; the original stays in the chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tasks.hashing import sha256_json

SEAL_FIELDS_EXCLUDED = ("prev_hash", "seal_hash")


class SealError(RuntimeError):
    """The sealed evaluation does not verify; the message names the first broken row or file."""


def plan_hash(plan: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the plan."""
    return sha256_json(plan)


def _payload(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in SEAL_FIELDS_EXCLUDED}


def seal_rows(rows: Iterable[dict[str, Any]], p_hash: str) -> list[dict[str, Any]]:
    """Chain ``rows`` (in order) to the plan hash: sets ``seq``, ``plan_hash``, ``prev_hash`` and
    ``seal_hash`` on copies of the rows and returns them."""
    out = []
    prev = p_hash
    for i, r in enumerate(rows):
        row = dict(r)
        row["seq"] = i
        row["plan_hash"] = p_hash
        row["prev_hash"] = prev
        row["seal_hash"] = sha256_json([prev, _payload(row)])
        prev = row["seal_hash"]
        out.append(row)
    return out


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_chain` checked: the plan hash, the row count and the chain head."""

    plan_hash: str
    rows: int
    head: str  # seal_hash of the last row: the one value that commits to everything
    fingerprint: str = ""  # the Ed25519 key that signed plan hash and head (set by verify_run)


def verify_chain(plan: dict[str, Any], recorded_plan_hash: str, rows: list[dict[str, Any]],
                 checkpoint_sha: Callable[[dict[str, Any]], str] | None = None) -> VerifyReport:
    """Recompute the plan hash and the chain; compare with what was recorded.

    Args:
        plan: the plan as read from disk.
        recorded_plan_hash: the plan hash committed before the attempts ran.
        rows: the evaluation rows in file order.
        checkpoint_sha: given a plan checkpoint entry, returns the SHA-256 of the checkpoint files
            now on disk (to catch a swapped adapter).

    Raises:
        SealError: naming the first inconsistency (plan, checkpoint file, or row ``seq``).
    """
    ph = plan_hash(plan)
    if ph != recorded_plan_hash:
        raise SealError(f"plan: hash {ph[:16]}... != committed {recorded_plan_hash[:16]}... (the plan was edited)")
    if checkpoint_sha is not None:
        for ck in plan["checkpoints"]:
            if ck.get("adapter_sha256"):
                now = checkpoint_sha(ck)
                if now != ck["adapter_sha256"]:
                    raise SealError(f"checkpoint {ck['name']!r}: files hash {now[:16]}... != planned {ck['adapter_sha256'][:16]}...")
    expected_cells = {(rec["record_id"], ck["name"], rec["harness_name"], a)
                      for rec in plan["records"] for ck in plan["checkpoints"] for a in range(plan["attempts"])}
    max_retries = int(plan.get("infra_retries", 0))
    head = check_links(rows, ph, lambda row: f"eval_id={str(row.get('eval_id'))[:12]}")
    seen = set()
    by_try: dict[tuple, dict[str, Any]] = {}  # (cell, retry) -> row
    for i, row in enumerate(rows):
        where = f"row {i} (seq={row.get('seq')}, eval_id={str(row.get('eval_id'))[:12]})"
        cell = (row["record_id"], row["checkpoint"], row["harness_name"], row["attempt"])
        if cell not in expected_cells:
            raise SealError(f"{where}: attempt {cell} is not in the plan")
        retry = int(row.get("retry") or 0)
        if retry:
            if retry > max_retries:
                raise SealError(f"{where}: retry {retry} of {cell} exceeds the plan's infra_retries={max_retries}")
            orig = by_try.get((cell, retry - 1))
            if orig is None or row.get("retry_of") != orig.get("eval_id") or orig.get("status") != "infra_error":
                raise SealError(f"{where}: retry {retry} of {cell} does not refer to an earlier infra_error row of "
                                "that attempt (retry_of)")
        elif row.get("retry_of"):
            raise SealError(f"{where}: a first attempt with retry_of={row.get('retry_of')!r}")
        if (cell, retry) in by_try:
            raise SealError(f"{where}: attempt {cell} (retry {retry}) appears twice")
        by_try[(cell, retry)] = row
        seen.add(cell)
    missing = expected_cells - seen
    if missing:
        raise SealError(f"{len(missing)} planned attempt(s) have no row, e.g. {sorted(missing)[0]}")
    for (cell, retry), row in by_try.items():
        if row.get("status") == "infra_error" and retry < max_retries and (cell, retry + 1) not in by_try:
            raise SealError(f"attempt {cell}: infra_error at retry {retry} but the plan's infra_retries={max_retries} "
                            "retry row is missing")
    return VerifyReport(plan_hash=ph, rows=len(rows), head=head)


def check_links(rows: list[dict[str, Any]], p_hash: str, name: Callable[[dict[str, Any]], str]) -> str:
    """Walk a chain made by :func:`seal_rows`: each row's ``seq``, ``plan_hash``, ``prev_hash``
    and ``seal_hash`` recomputed from the rows in file order; returns the head (the last row's
    ``seal_hash``, ``p_hash`` when there is no row). ``name(row)`` labels a row in messages.

    Raises:
        SealError: naming the first row that was dropped, added, reordered or changed.
    """
    prev = p_hash
    for i, row in enumerate(rows):
        where = f"row {i} (seq={row.get('seq')}, {name(row)})"
        if row.get("seq") != i:
            raise SealError(f"{where}: seq is {row.get('seq')}, expected {i} (rows dropped, added or reordered)")
        if row.get("plan_hash") != p_hash:
            raise SealError(f"{where}: plan_hash differs from the plan")
        if row.get("prev_hash") != prev:
            raise SealError(f"{where}: prev_hash does not chain to the row before (rows dropped, added or reordered)")
        if row.get("seal_hash") != sha256_json([prev, _payload(row)]):
            raise SealError(f"{where}: seal_hash does not match its contents (a value was changed)")
        prev = row["seal_hash"]
    return prev


# How far a recomputed float may be from the file's where :func:`check_recomputed` is told that the
# machine's float kernels decide its last bits (BLAS or libm on another CPU): a rounding difference
# is ~1e-16 relative; a tampered statistic moves far more.
REL_TOL = 1e-9
ABS_TOL = 1e-12


def floats_close(a: Any, b: Any) -> bool:
    """Equal, or two floats within REL_TOL / ABS_TOL of each other (NaN matches NaN)."""
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL) or (math.isnan(a) and math.isnan(b))
    return False


def check_recomputed(path: str, got: list[dict[str, Any]], expected: list[dict[str, Any]],
                     within_tolerance: Callable[[dict[str, Any], str], bool] | None = None) -> None:
    """A table as read from ``path`` against the same table recomputed from sealed rows, row by
    row and value for value.

    ``within_tolerance(expected_row, column)``: True for the values whose last bits depend on the
    machine's float kernels, compared within ``REL_TOL`` (relative) or ``ABS_TOL`` (absolute)
    instead of exactly (``harnessrl verify`` passes it when it recomputes on another CPU or BLAS
    kernel than the one that wrote ``path``); every other value, and every value when None, must be
    equal.

    Raises:
        SealError: another row count, or the first row and column that differ (beyond the
            tolerance, for a column given one).
    """
    if len(got) != len(expected):
        raise SealError(f"{path}: {len(got)} rows, recomputed {len(expected)}")

    def same(e: dict[str, Any], g: dict[str, Any], k: str) -> bool:
        if within_tolerance is not None and within_tolerance(e, k):
            return floats_close(g.get(k), e[k])
        return g.get(k) == e[k]

    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            col = next((k for k in e if not same(e, g, k)), next(iter(set(g) ^ set(e)), None))
            if col is None:
                continue  # only kernel-dependent values differ, each within the tolerance
            tol = " (beyond the tolerance for a kernel-dependent value)" if within_tolerance and col in e and \
                within_tolerance(e, col) else ""
            raise SealError(f"{path} row {i}: {col}={g.get(col)!r}, recomputed {e.get(col)!r}{tol}")
