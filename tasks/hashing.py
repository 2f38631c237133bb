"""Content hashing: canonical JSON and file digests.

Every identity in harnessrl (task_hash, harness_id, record_id, config hash, seal hashes) is the
SHA-256 of a canonical JSON encoding: keys sorted, no whitespace, UTF-8, floats by ``repr``. Two
objects that compare equal as JSON values always hash equal, on any machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(obj: Any) -> str:
    """Encode ``obj`` as canonical JSON (sorted keys, compact separators, UTF-8 kept as is).

    Raises:
        TypeError: when ``obj`` holds a value JSON cannot encode (the message names its type).
        ValueError: for NaN or infinite floats, which have no canonical JSON form.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_text(text: str) -> str:
    """Hex SHA-256 of a UTF-8 string (64 lowercase hex characters)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of :func:`canonical_json` of ``obj``."""
    return sha256_text(canonical_json(obj))


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_dir(path: str | Path) -> str:
    """Hex SHA-256 over a directory tree: sorted relative paths and each file's SHA-256.

    Used for adapter checkpoints (a folder of safetensors + JSON). Raises FileNotFoundError when
    ``path`` is not a directory.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"not a directory: {root}")
    entries = [
        [p.relative_to(root).as_posix(), sha256_file(p)] for p in sorted(root.rglob("*")) if p.is_file()
    ]
    return sha256_json(entries)


def seed_from(*parts: Any) -> int:
    """A 63-bit integer seed derived from ``parts`` (e.g. the config seed and a record id)."""
    return int(sha256_json(list(parts))[:15], 16)


def jsonable(obj: Any) -> Any:
    """``obj`` with every dict key a string, tuples as lists, NaN/inf floats and unknown objects
    as their ``str``: something canonical JSON can hold (suite metadata comes in many types)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else str(obj)
    return str(obj)
