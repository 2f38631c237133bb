"""Helpers for the suite tests: a sandbox with a task's workspace written into it, and a grading
context around it (what the engine gives a verifier)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from tests.facilities import bwrap_missing, require


def require_sandbox() -> None:
    """Skip (locally) / fail (CI) unless bwrap and the sandbox's pytest are installed."""
    from tasks.environments.sandbox.bwrap import sandbox_site

    require("bubblewrap", bwrap_missing())
    require("pytest for the sandbox's python", None if sandbox_site() else "run scripts/bootstrap.sh")


def new_sandbox(workspace: dict[str, Any] | None = None, **cfg: Any):
    """A bwrap sandbox with ``workspace`` (Task.workspace) set up in /app.

    Folders are made by a command inside the sandbox (so that the sandbox user owns them) before
    the files are written, then the set-up commands run in order.
    """
    from tasks.config import SandboxConfig
    from tasks.environments.sandbox import make_sandbox

    sb = make_sandbox(SandboxConfig(**{"wall_s": 30.0, "cpu_s": 30, **cfg}))
    ws = workspace or {}
    write_files(sb, ws.get("files", {}))
    for cmd in ws.get("setup", []):
        r = sb.exec(["sh", "-c", cmd])
        assert r.status == "ok", r
    return sb


class Ctx:
    """A GradeContext around one sandbox."""

    browser = None

    def __init__(self, sb: Any):
        self._sb = sb

    def sandbox(self) -> Any:
        return self._sb


def write_files(sb, files: dict) -> None:
    """Write ``files`` (sandbox-relative path -> text) into the sandbox, making their folders."""
    dirs = sorted({str(PurePosixPath(p).parent) for p in files} - {"."})
    if dirs:
        r = sb.exec(["mkdir", "-p", "--", *dirs])
        assert r.status == "ok", r
    for path, text in files.items():
        sb.write_file(path, text)
