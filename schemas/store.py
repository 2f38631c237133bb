"""The artifact store: the only code that writes or reads Parquet.

Layout of a run (``root`` is a local path or any fsspec URL, e.g. ``s3://bucket/runs/x``)::

    <root>/<stage>/<name>.parquet          the artifact
    <root>/<stage>/<name>.manifest.json    its manifest (see :meth:`ArtifactStore.write`)

Writes are atomic (temp file, then rename): a reader sees the old file or the new one, never half
of one; a failed write leaves earlier artifacts untouched. Every write and every read checks the
contract (exact schema + Great Expectations suite); every read checks the file's SHA-256 against
its manifest, so a changed byte is caught before it reaches a stage.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from schemas.contracts import Contract, get_contract
from schemas.faults import fault_point
from schemas.machine import machine_facts
from schemas.validation import ContractViolation, check_expectations, check_rows, check_schema

_PACKAGES = (
    "harnessrl", "pyarrow", "great_expectations", "prefect", "torch", "transformers", "peft",
    "reasoning_gym", "pydantic",
)


class ArtifactError(RuntimeError):
    """An artifact that cannot be written or read: contract violation, missing file, hash mismatch."""


class ArtifactRef(BaseModel):
    """A pointer to one written artifact. Its identity is ``sha256`` (of the Parquet bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str
    stage: str
    path: str  # relative to the store root
    sha256: str
    rows: int
    schema_version: int
    contract: str = ""  # the contract's name when it differs from the artifact's (e.g. online_episodes)


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """Git SHA and dirty flag of the source tree this package was imported from (``None`` values
    when it is not a git checkout)."""
    here = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return {"git_sha": None, "dirty": None}
        return {"git_sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"git_sha": None, "dirty": None}


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages whose behaviour an artifact depends on."""
    out: dict[str, str | None] = {}
    for p in _PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def _to_table(contract: Contract, rows: pa.Table | Sequence[Mapping[str, Any]]) -> pa.Table:
    if isinstance(rows, pa.Table):
        check_schema(contract, rows)
        return rows.cast(contract.schema)
    rows = list(rows)
    want = set(contract.schema.names)
    for i, r in enumerate(rows):
        keys = set(r)
        if keys != want:
            raise ContractViolation(
                f"artifact {contract.name!r}: row {i} has missing columns {sorted(want - keys)} "
                f"and unexpected columns {sorted(keys - want)}"
            )
    try:  # column by column: ~4x faster than Table.from_pylist on rows with long token lists
        return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in contract.schema},
                        schema=contract.schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        # name the column: try each column alone
        for f in contract.schema:
            try:
                pa.array([r[f.name] for r in rows], type=f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as ce:
                bad = next(
                    (i for i, r in enumerate(rows) if not _fits(r[f.name], f.type)), None
                )
                raise ContractViolation(
                    f"artifact {contract.name!r}: column {f.name!r} (type {f.type}) cannot hold row {bad}'s "
                    f"value {rows[bad][f.name]!r}" if bad is not None else
                    f"artifact {contract.name!r}: column {f.name!r} (type {f.type}): {ce}"
                ) from None
        raise ContractViolation(f"artifact {contract.name!r}: {e}") from None


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], type=typ)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return False


ROW_GROUP_ROWS = 1 << 16
_PARQUET_OPTIONS = {"compression": "zstd", "write_statistics": True}


def _contract_metadata(contract: Contract) -> dict[bytes, bytes]:
    return {b"harnessrl.contract": contract.name.encode(), b"harnessrl.version": str(contract.version).encode()}


def parquet_bytes(contract: Contract, table: pa.Table) -> bytes:
    """Serialise ``table`` deterministically: same rows -> same bytes (no timestamps inside)."""
    table = table.replace_schema_metadata(_contract_metadata(contract))
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=ROW_GROUP_ROWS, **_PARQUET_OPTIONS)
    return buf.getvalue()


class ArtifactStore:
    """Writes and reads the artifacts of one run under ``root`` (a path or an fsspec URL).

    Args:
        root: run folder, e.g. ``runs/default-1a2b3c4d5e`` or ``s3://bucket/runs/default-...``.
        storage_options: passed to fsspec for remote stores (credentials, endpoint URL).
    """

    def __init__(self, root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None):
        self.url = str(root)
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **dict(storage_options or {}))
        self.fs.makedirs(self.root, exist_ok=True)

    # ---- paths ---------------------------------------------------------------------------
    def _abs(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    @property
    def is_local(self) -> bool:
        """True when the store is on the local filesystem (a path or a ``file://`` URL)."""
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(self.fs, LocalFileSystem)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._abs(rel)))

    def url_of(self, rel: str) -> str:
        """An address of ``rel`` a person can open: a ``file://`` URI for a local store, else the
        store's URL joined with ``rel`` (``s3://bucket/run/analyze/plots/x.png``)."""
        if self.is_local:
            return Path(self._abs(rel)).resolve().as_uri()
        return f"{self.url.rstrip('/')}/{rel}"

    def list_files(self, folder: str) -> list[str]:
        """Files directly under ``folder`` (relative to the root), as relative paths, sorted;
        temp files of interrupted writes left out; [] when the folder does not exist."""
        base = self._abs(folder).rstrip("/")
        if not self.fs.exists(base):
            return []
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False)]
        return sorted(f"{folder.rstrip('/')}/{n}" for n in names if not n.startswith(".tmp-")
                      and self.fs.isfile(f"{base}/{n}"))

    # ---- raw atomic bytes ----------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> str:
        """Atomically write ``data`` to ``rel`` (temp file in the same folder, then rename).
        Returns the hex SHA-256 of ``data``."""
        final = self._abs(rel)
        parent = final.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{final.rsplit('/', 1)[1]}"
        try:
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
                if hasattr(f, "flush"):
                    f.flush()
                if hasattr(f, "fileno"):
                    try:
                        os.fsync(f.fileno())
                    except (OSError, io.UnsupportedOperation):
                        pass
            fault_point(f"tmp-written:{rel}")
            self.fs.mv(tmp, final)
        except BaseException:
            try:
                if self.fs.exists(tmp):
                    self.fs.rm(tmp)
            finally:
                raise
        return hashlib.sha256(data).hexdigest()

    def stray_temp_files(self, folder: str) -> list[str]:
        """Temp files under ``folder`` (relative) left by writes that were interrupted (a killed
        process never reaches the rename or the clean-up): paths relative to the root, sorted.
        They are never artifacts (readers only open ``<name>.parquet`` via a manifest)."""
        base = self._abs(folder).rstrip("/")
        if not self.fs.exists(base):
            return []
        found = [p for p in self.fs.find(base) if p.rsplit("/", 1)[-1].startswith(".tmp-")]
        return sorted(p[len(self.root.rstrip("/")) + 1:] for p in found)

    def remove_stray_temp_files(self, folder: str) -> list[str]:
        """Delete :meth:`stray_temp_files` of ``folder``; returns what was removed. Only safe when no
        other process writes under ``folder`` (one pipeline per run folder)."""
        gone = self.stray_temp_files(folder)
        for rel in gone:
            self.fs.rm(self._abs(rel))
        return gone

    def read_bytes(self, rel: str) -> bytes:
        """Bytes of ``rel``. Raises ArtifactError when it does not exist."""
        try:
            return self.fs.cat_file(self._abs(rel))
        except FileNotFoundError:
            raise ArtifactError(f"{self.url}/{rel} does not exist") from None

    def write_json(self, rel: str, obj: Any) -> str:
        """Atomically write ``obj`` as indented, key-sorted JSON. Returns its SHA-256."""
        return self.write_bytes(rel, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def write_text(self, rel: str, text: str) -> str:
        return self.write_bytes(rel, text.encode("utf-8"))

    def put_dir(self, rel: str, local_dir: str | os.PathLike[str]) -> None:
        """Copy a local folder (e.g. a saved adapter) into the store under ``rel``, file by file,
        each atomically. The folder's identity is recorded by the artifact that refers to it."""
        src = Path(local_dir)
        for p in sorted(src.rglob("*")):
            if p.is_file():
                self.write_bytes(f"{rel}/{p.relative_to(src).as_posix()}", p.read_bytes())

    def get_dir(self, rel: str, local_dir: str | os.PathLike[str]) -> Path:
        """The folder ``rel`` as a local path: itself for a local store, else a copy in ``local_dir``."""
        if self.is_local:
            return Path(self._abs(rel))
        dst = Path(local_dir)
        self.fs.get(self._abs(rel).rstrip("/") + "/", str(dst), recursive=True)
        return dst

    # ---- artifacts ------------------------------------------------------------------------
    def write(
        self,
        stage: str,
        name: str,
        rows: pa.Table | Iterable[Mapping[str, Any]],
        *,
        inputs: Sequence[ArtifactRef] = (),
        config_hash: str = "",
        contract: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ArtifactRef:
        """Validate ``rows`` against the contract and write ``<stage>/<name>.parquet`` + manifest.

        The manifest holds: contract name and version, row count, the file's SHA-256, the inputs'
        names and SHA-256s, ``config_hash``, the code version (git SHA + dirty flag), package
        versions, ``machine`` (the CPU, torch's and numpy's float kernels, the kernel environment
        variables and thread counts of the writing process: :func:`schemas.machine.machine_facts`)
        and ``created_at`` (UTC, ISO 8601). The Parquet bytes themselves hold no timestamp and no
        machine fact, so the same rows give the same SHA-256 on any machine. Manifests written
        before ``machine`` was recorded have no such key and read as before.

        Raises:
            ArtifactError: the rows break the contract (the message names the artifact, the
                column and the offending rows), or there are none and the contract says the
                artifact may not be empty (one line naming it and the likely cause); nothing is
                written in that case.
        """
        c = get_contract(contract or name)
        try:
            table = _to_table(c, rows if isinstance(rows, pa.Table) else list(rows))
            check_schema(c, table)
            check_rows(c, table.num_rows)
            check_expectations(c, table)
        except ContractViolation as e:
            raise ArtifactError(f"[{stage}/{name}] {e}") from None
        data = parquet_bytes(c, table)
        rel = f"{stage}/{name}.parquet"
        sha = self.write_bytes(rel, data)
        fault_point(f"renamed:{rel}")
        return self._write_manifest(stage, name, c, table.num_rows, len(data), sha, inputs, config_hash, extra)

    def _write_manifest(self, stage: str, name: str, c: Contract, rows: int, size: int, sha: str,
                        inputs: Sequence[ArtifactRef], config_hash: str, extra: Mapping[str, Any] | None
                        ) -> ArtifactRef:
        manifest = {
            "artifact": name,
            "stage": stage,
            "contract": c.name,
            "schema_version": c.version,
            "rows": rows,
            "bytes": size,
            "sha256": sha,
            "inputs": [{"name": r.name, "stage": r.stage, "sha256": r.sha256} for r in inputs],
            "config_hash": config_hash,
            "code_version": code_version(),
            "packages": package_versions(),
            "machine": machine_facts(),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            **({"extra": dict(extra)} if extra else {}),
        }
        self.write_json(f"{stage}/{name}.manifest.json", manifest)
        fault_point(f"manifest:{stage}/{name}")
        return ArtifactRef(name=name, stage=stage, path=f"{stage}/{name}.parquet", sha256=sha, rows=rows,
                           schema_version=c.version, contract=c.name if c.name != name else "")

    def stream(self, stage: str, name: str, *, contract: str | None = None) -> "ArtifactStream":
        """An :class:`ArtifactStream` for ``<stage>/<name>.parquet``: rows added batch by batch,
        written as they come, committed (renamed into place + manifest) at the end."""
        return ArtifactStream(self, stage, name, get_contract(contract or name))

    def manifest(self, stage: str, name: str) -> dict[str, Any]:
        return self.read_json(f"{stage}/{name}.manifest.json")

    def ref(self, stage: str, name: str) -> ArtifactRef:
        """The :class:`ArtifactRef` of an artifact already in the store (from its manifest)."""
        m = self.manifest(stage, name)
        return ArtifactRef(
            name=name, stage=stage, path=f"{stage}/{name}.parquet", sha256=m["sha256"], rows=m["rows"],
            schema_version=m["schema_version"], contract=m["contract"] if m["contract"] != name else "",
        )

    def read(self, ref: ArtifactRef | tuple[str, str], *, contract: str | None = None) -> pa.Table:
        """Read an artifact, checking SHA-256, schema, version and expectations.

        Raises:
            ArtifactError: missing file, SHA-256 different from the ref/manifest (the file was
                changed after it was written), or a contract violation.
        """
        if isinstance(ref, tuple):
            ref = self.ref(*ref)
        data = self.read_bytes(ref.path)
        sha = hashlib.sha256(data).hexdigest()
        if sha != ref.sha256:
            raise ArtifactError(
                f"{self.url}/{ref.path}: SHA-256 {sha[:16]}... differs from the recorded {ref.sha256[:16]}...; "
                "the file changed after it was written (rerun the stage with --from)"
            )
        table = pq.read_table(pa.BufferReader(data))  # native buffer: no arrow thread touches a Python object
        c = get_contract(contract or ref.contract or ref.name)
        meta = table.schema.metadata or {}
        version = int(meta.get(b"harnessrl.version", b"0"))
        if version != c.version and version not in c.older:
            raise ArtifactError(f"{ref.path}: contract {c.name} version {version} on disk, code expects {c.version}"
                                + (f" (or {sorted(c.older)})" if c.older else ""))
        c = c.at_version(version)  # an earlier version still read: its own schema
        try:
            check_schema(c, table)
            check_expectations(c, table)
        except ContractViolation as e:
            raise ArtifactError(f"[read {ref.path}] {e}") from None
        return table.replace_schema_metadata(None)

    def raw_rows(self, stage: str, name: str) -> list[dict[str, Any]]:
        """The rows of ``<stage>/<name>.parquet`` with no hash, schema or expectation check: for
        auditors (``harnessrl verify``) that must name the broken row of a changed file rather
        than refuse the file. Raises ArtifactError when it is missing or not Parquet."""
        try:
            return pq.read_table(pa.BufferReader(self.read_bytes(f"{stage}/{name}.parquet"))).to_pylist()
        except (pa.ArrowInvalid, OSError) as e:
            raise ArtifactError(f"{self.url}/{stage}/{name}.parquet cannot be read as Parquet: {e}") from None

    def rows(self, ref: ArtifactRef | tuple[str, str], **kw: Any) -> list[dict[str, Any]]:
        """:meth:`read` as a list of row dicts."""
        return self.read(ref, **kw).to_pylist()

    def rows_where(self, ref: ArtifactRef, column: str, values: Iterable[Any],
                   columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows of an artifact whose ``column`` is in ``values``, read row group by row group
        after the file's SHA-256 is checked against ``ref`` (memory holds the file's bytes and one
        row group as Arrow, never the whole artifact as rows). The schema and expectations were
        checked when the artifact was written or streamed. ``columns``: only these columns are
        decoded and returned (``column`` is read for the filter either way); None: all.

        Raises:
            ArtifactError: missing file, SHA-256 different from the ref, or ``column`` (or one of
                ``columns``) not in it.
        """
        import pyarrow.compute as pc

        data = self.read_bytes(ref.path)
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ArtifactError(f"{self.url}/{ref.path}: SHA-256 differs from the recorded {ref.sha256[:16]}...; "
                                "the file changed after it was written (rerun the stage with --from)")
        pf = pq.ParquetFile(pa.BufferReader(data))
        for c in [column, *(columns or [])]:
            if c not in pf.schema_arrow.names:
                raise ArtifactError(f"{ref.path}: no column {c!r}")
        want = pa.array(sorted(set(values)), type=pf.schema_arrow.field(column).type)
        read = None if columns is None else list(dict.fromkeys([column, *columns]))
        out: list[dict[str, Any]] = []
        for i in range(pf.num_row_groups):
            t = pf.read_row_group(i, columns=read)
            t = t.filter(pc.is_in(t[column], value_set=want))
            out += (t if columns is None else t.select(columns)).to_pylist()
        return out


class _HashingFile:
    """A binary file wrapper that feeds every written byte to a SHA-256 (the bytes never sit in
    memory twice) and counts them."""

    def __init__(self, f: Any):
        self.f, self.sha, self.size, self.closed = f, hashlib.sha256(), 0, False

    def write(self, data: Any) -> int:
        b = memoryview(data).cast("B")
        self.sha.update(b)
        self.size += len(b)
        self.f.write(b)
        return len(b)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:  # the stream closes the underlying file itself (after fsync)
        self.closed = True


class ArtifactStream:
    """One artifact written while its rows are still being produced (e.g. the evaluate stage's
    turns, attempt shard by attempt shard): memory holds at most one row group.

    :meth:`add` checks each batch against the contract's exact schema and, for its ``unique`` and
    ``compound_unique`` expectations, against every earlier batch (the keys seen are kept). Rows
    are cut into row groups of ``ROW_GROUP_ROWS`` whatever the batch sizes; each row group is run
    through the Great Expectations suite (one validation per group, not per batch: it costs a
    fraction of a second) and written to a temp file beside the artifact as it fills, so the file
    is byte-identical to :meth:`ArtifactStore.write` of the same rows. :meth:`commit` renames it
    into place and writes the manifest; :meth:`abort` (or leaving a ``with`` block without a
    commit) removes the temp file, so a failed stream leaves nothing and earlier artifacts intact.

    Raises (from :meth:`add` or :meth:`commit`): ArtifactError naming the artifact, the column and
    the row (its index in the artifact) that breaks the contract, or (from :meth:`commit`) naming
    an artifact with no rows whose contract says it may not be empty; the stream is then aborted,
    so nothing is written.
    """

    def __init__(self, store: ArtifactStore, stage: str, name: str, contract: Contract):
        self.store, self.stage, self.name, self.contract = store, stage, name, contract
        self.rel = f"{stage}/{name}.parquet"
        final = store._abs(self.rel)
        self._parent = final.rsplit("/", 1)[0]
        self._tmp = f"{self._parent}/.tmp-{uuid.uuid4().hex}-{name}.parquet"
        self._file: Any = None
        self._hashing: _HashingFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0
        self._keys = {tuple(e[1]) if e[0] == "compound_unique" else (e[1],): set()
                      for e in contract.expectations if e[0] in ("unique", "compound_unique")}
        self.done = False

    def __enter__(self) -> "ArtifactStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.done:
            self.abort()

    def add(self, rows: pa.Table | Iterable[Mapping[str, Any]]) -> None:
        """Validate one batch (a table or row dicts) and queue it; full row groups are written."""
        if self.done:
            raise ArtifactError(f"[{self.stage}/{self.name}] the stream is already committed or aborted")
        c = self.contract
        try:
            table = _to_table(c, rows if isinstance(rows, pa.Table) else list(rows))
            check_schema(c, table)
            self._check_keys(table)
        except ContractViolation as e:
            self.abort()
            raise ArtifactError(f"[{self.stage}/{self.name}] {e}") from None
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        while self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _check_keys(self, table: pa.Table) -> None:
        for cols, seen in self._keys.items():
            keys = list(zip(*(table.column(k).to_pylist() for k in cols)))
            for i, k in enumerate(keys):
                if k in seen:
                    what = k[0] if len(cols) == 1 else k
                    raise ContractViolation(f"artifact {self.contract.name!r}: row {self.rows + i} repeats "
                                            f"{list(cols) if len(cols) > 1 else cols[0]!r} = {what!r} of an earlier "
                                            "batch (must be unique)")
            seen.update(keys)

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending)
        head, rest = table.slice(0, n), table.slice(n)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows
        self._validate(head, self.rows - self._pending_rows - n)
        if self._writer is None:
            self.store.fs.makedirs(self._parent, exist_ok=True)
            self._file = self.store.fs.open(self._tmp, "wb")
            self._hashing = _HashingFile(self._file)
            schema = self.contract.schema.with_metadata(_contract_metadata(self.contract))
            self._writer = pq.ParquetWriter(self._hashing, schema, **_PARQUET_OPTIONS)
        self._writer.write_table(head.replace_schema_metadata(_contract_metadata(self.contract)),
                                 row_group_size=ROW_GROUP_ROWS)

    def _validate(self, group: pa.Table, first_row: int) -> None:
        """The contract's expectations over one row group (rows ``first_row`` on of the artifact)."""
        try:
            check_expectations(self.contract, group)
        except ContractViolation as e:
            self.abort()
            where = f" (row indices counted from artifact row {first_row})" if first_row else ""
            raise ArtifactError(f"[{self.stage}/{self.name}] {e}{where}") from None

    def commit(self, *, inputs: Sequence[ArtifactRef] = (), config_hash: str = "",
               extra: Mapping[str, Any] | None = None) -> ArtifactRef:
        """Write the last row group, close the file, rename it into place and write the manifest
        (as :meth:`ArtifactStore.write` does); returns the artifact's ref."""
        if self.done:
            raise ArtifactError(f"[{self.stage}/{self.name}] the stream is already committed or aborted")
        try:
            check_rows(self.contract, self.rows)
        except ContractViolation as e:
            self.abort()
            raise ArtifactError(f"[{self.stage}/{self.name}] {e}") from None
        try:
            if self._writer is None:  # fewer rows than one row group: written as write() would
                table = pa.concat_tables(self._pending) if self._pending else self.contract.schema.empty_table()
                self._pending = []
                self._validate(table, 0)
                data = parquet_bytes(self.contract, table)
                sha, size = self.store.write_bytes(self.rel, data), len(data)
            else:
                if self._pending_rows:
                    self._flush(self._pending_rows)
                self._writer.close()
                assert self._hashing is not None
                self._file.flush()
                if hasattr(self._file, "fileno"):
                    try:
                        os.fsync(self._file.fileno())
                    except (OSError, io.UnsupportedOperation):
                        pass
                self._file.close()
                sha, size = self._hashing.sha.hexdigest(), self._hashing.size
                fault_point(f"tmp-written:{self.rel}")
                self.store.fs.mv(self._tmp, self.store._abs(self.rel))
        except BaseException:
            self.abort()
            raise
        self.done = True
        fault_point(f"renamed:{self.rel}")
        return self.store._write_manifest(self.stage, self.name, self.contract, self.rows, size, sha, inputs,
                                          config_hash, extra)

    def abort(self) -> None:
        """Drop everything written so far (the temp file); the artifact's path is untouched."""
        self.done = True
        self._pending = []
        try:
            if self._writer is not None:
                try:
                    self._writer.close()
                except Exception:  # noqa: BLE001 - the file is removed below either way
                    pass
                self._file.close()
        finally:
            if self.store.fs.exists(self._tmp):
                self.store.fs.rm(self._tmp)
