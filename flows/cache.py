"""A stage's cached result counts only when its artifacts' bytes are still the ones it names.

Prefect's cache (``flows.common.stage_task``: a content-hash key, results persisted in the run
folder) trusts the run folder: a result record says "this key produced these artifacts", and a
rerun returns it as ``Cached`` without looking at the files. Prefect 3 has no hook that validates
a cached value (its cache policies compute keys, ``cache_expiration`` is time only), so
:func:`check_cached_result` runs before the stage task is called: it reads the result record the
key would hit and checks every :class:`schemas.ArtifactRef` it names, streaming each Parquet file
through SHA-256:

* the manifest exists and names the same SHA-256 and row count as the ref;
* the Parquet file exists and its SHA-256 is the ref's.

When one does not hold, the stage is called with ``refresh_cache=True`` (Prefect's own way to
ignore a cached result): it runs again, rewrites its artifacts, and the stages after it follow
through their content-hash keys (byte-identical outputs keep theirs ``Cached``). The evaluate
stage is the exception (:data:`SEALED_STAGES`): its rows are sealed (a hash chain from a signed
plan, witnessed by the Prefect API, :mod:`tasks.evaluate.seal`), and running it again writes a new
plan signature, new witness records and a new chain over the old files, which erases the evidence
that the sealed record was changed. A changed sealed artifact is refused instead:
:class:`StaleCacheError` names the file and the ``harnessrl run --from evaluate`` that re-seals.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from schemas import ArtifactError, ArtifactRef, ArtifactStore

log = logging.getLogger("harnessrl.flows")

# stages whose artifacts are a sealed record: never rewritten without an explicit --from
SEALED_STAGES = frozenset({"evaluate"})
CHUNK = 1 << 20  # bytes read per SHA-256 update (large artifacts are streamed, not loaded)


class StaleCacheError(ArtifactError):
    """A sealed stage's cached artifact differs from what its result names; the stage is not rerun
    by itself. ``path`` is the store path, ``problem`` what differs, ``stage`` the stage to rerun
    with ``--from``."""

    def __init__(self, stage: str, path: str, problem: str, url: str):
        self.stage, self.path, self.problem = stage, path, problem
        super().__init__(f"{url.rstrip('/')}/{path}: {problem}; the {stage} stage's rows are sealed, so it is not "
                         f"rerun by itself: check it with `harnessrl verify`, then re-seal with "
                         f"`harnessrl run --from {stage}` (same config and --run-dir)")


def file_sha256(store: ArtifactStore, rel: str) -> str:
    """Hex SHA-256 of the file ``rel`` of ``store``, read in :data:`CHUNK`-byte pieces.

    Raises:
        FileNotFoundError: no such file.
    """
    h = hashlib.sha256()
    with store.fs.open(store._abs(rel), "rb") as f:
        while True:
            piece = f.read(CHUNK)
            if not piece:
                return h.hexdigest()
            h.update(piece)


def artifact_problem(store: ArtifactStore, ref: ArtifactRef) -> str | None:
    """What is wrong with ``ref``'s files in ``store`` (one phrase), or None when its manifest and
    Parquet file both still match it (SHA-256 and row count)."""
    manifest_rel = f"{ref.stage}/{ref.name}.manifest.json"
    if not store.exists(manifest_rel):
        return "its manifest is missing"
    try:
        m = store.manifest(ref.stage, ref.name)
    except (ValueError, OSError, ArtifactError) as e:
        return f"its manifest cannot be read ({type(e).__name__})"
    if m.get("sha256") != ref.sha256 or m.get("rows") != ref.rows:
        return (f"its manifest (SHA-256 {str(m.get('sha256'))[:12]}, {m.get('rows')} rows) is not the cached result's "
                f"(SHA-256 {ref.sha256[:12]}, {ref.rows} rows)")
    try:
        sha = file_sha256(store, ref.path)
    except FileNotFoundError:
        return "the file is missing"
    if sha != ref.sha256:
        return f"SHA-256 {sha[:12]} differs from its manifest's {ref.sha256[:12]} (changed after it was written)"
    return None


def cached_outputs(storage: Any, key: str) -> dict[str, ArtifactRef] | None:
    """The outputs of the result record Prefect holds under ``key`` in ``storage`` (what
    :func:`flows.common.result_storage` returns), or None when there is none (or it has expired).

    Raises:
        Exception: whatever Prefect raises for a record that exists but cannot be read.
    """
    from prefect.results import ResultStore, resolve_result_storage

    rs = ResultStore(result_storage=resolve_result_storage(storage, _sync=True), cache_result_in_memory=False)
    if not rs.exists(key):
        return None
    value = rs.read(key).result
    return value if isinstance(value, dict) else None


def check_cached_result(store: ArtifactStore, stage: str, storage: Any, key: str) -> bool:
    """Whether ``stage`` must run although a cached result exists under ``key`` (the
    ``refresh_cache`` to call it with): True when an artifact it names fails
    :func:`artifact_problem` or the record cannot be read; False when there is no cached result
    (Prefect runs the stage anyway) or every artifact matches.

    Raises:
        StaleCacheError: ``stage`` is in :data:`SEALED_STAGES` and one of its artifacts fails.
    """
    try:
        outputs = cached_outputs(storage, key)
    except Exception as e:  # a result record cut or changed on disk: Prefect could not use it either
        log.warning("%s: its cached result cannot be read (%s: %s): running the stage again", stage,
                    type(e).__name__, str(e)[:200])
        return True
    if not outputs:
        return False
    for ref in outputs.values():
        problem = artifact_problem(store, ref)
        if problem is None:
            continue
        if stage in SEALED_STAGES:
            raise StaleCacheError(stage, ref.path, problem, store.url)
        log.warning("%s: the cached result names %s, but %s: running the stage again", stage, ref.path, problem)
        return True
    return False
