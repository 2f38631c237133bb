"""Reading a YAML mapping and reporting pydantic validation errors, for every config-like file
(run configs, harness specs): one message per problem, naming the file, the key and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def load_mapping(path: Path, error: type[Exception]) -> dict[str, Any]:
    """The top-level mapping of a YAML file.

    Raises:
        error: the file is not valid YAML or its top level is not a mapping.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    if data is None:
        raise error(f"{path}: the file is empty; expected a mapping of keys (name, suites, harnesses, ...)")
    if not isinstance(data, dict):
        raise error(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def describe(path: Path, exc: ValidationError, sources: dict[str, str] | None = None) -> str:
    """One line per validation error: ``SOURCE: key 'a.b' = VALUE: message``. SOURCE is ``path``,
    or ``sources[k]`` for the longest dotted key ``k`` of ``sources`` that the error's key equals
    or lies under (e.g. ``"--set"`` for a value given on the command line)."""
    lines = []
    base_path = path
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        owner = max((k for k in (sources or {}) if key == k or key.startswith(k + ".")), key=len, default=None)
        path = sources[owner] if owner is not None and sources else base_path
        value = err.get("input")
        if err["type"] == "missing":
            lines.append(f"{path}: key {key!r} is missing (required)")
            continue
        if err["type"] == "value_error" and isinstance(value, dict):
            # a cross-field check: its message names the keys and values itself
            msg = err["msg"].removeprefix("Value error, ")
            where = f" (in {key!r})" if err["loc"] else ""
            lines.append(f"{path}: {msg}{where}")
            continue
        shown = "{...}" if isinstance(value, dict) else repr(value)
        lines.append(f"{path}: key {key!r} = {shown[:200]}: {err['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)
