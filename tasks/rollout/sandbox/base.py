"""The sandbox interface (exec, write_file, read_file, cleanup) and its result type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tasks.config import SandboxConfig

ExecStatus = Literal["ok", "error", "timeout", "output_limit"]


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, missing backend): an infrastructure error."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did. ``status``: ``ok`` (exit 0), ``error`` (non-zero exit or killed by a
    limit other than time), ``timeout`` (wall-clock limit hit, the process tree was killed).
    ``wall_s`` in seconds; ``stdout``/``stderr`` decoded UTF-8 (replacement chars), each cut to
    the configured byte limit, ``truncated`` True when anything was cut."""

    status: ExecStatus
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    truncated: bool = False

    def combined_output(self) -> str:
        out = self.stdout + (("\n" if self.stdout and self.stderr else "") + self.stderr if self.stderr else "")
        if self.status == "timeout":
            out += "\n[killed: time limit]"
        return out


class Sandbox(Protocol):
    """One isolated workspace for one episode. Paths are relative to the work dir."""

    def exec(self, argv: list[str], *, stdin: str | None = None, timeout_s: float | None = None) -> ExecResult: ...

    def write_file(self, path: str, data: bytes | str) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def cleanup(self) -> None: ...


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """A fresh sandbox of the configured backend.

    Raises:
        SandboxError: the backend is not installed or cannot start here.
    """
    if cfg.backend == "bwrap":
        from tasks.rollout.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(cfg)
    raise SandboxError(f"sandbox.backend={cfg.backend!r} is not available")
