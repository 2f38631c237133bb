"""The sandbox interface (exec, write_file, read_file, cleanup), its result type, and the host
side of the exec server that both backends run inside the sandbox (``exec_server.py``).

One sandbox per episode: a backend starts one isolated environment (a bubblewrap process tree or
a docker container) whose process 1 is the exec server; files under the work dir ``/app`` persist
across :meth:`Sandbox.exec` calls of the episode; no process outlives the exec that started it;
:meth:`Sandbox.cleanup` ends the environment and leaves no process, container or host file.
"""

from __future__ import annotations

import abc

import base64
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from tasks.config import SandboxConfig
from tasks.environments.errors import SandboxError, SandboxPathError

ExecStatus = Literal["ok", "error", "timeout", "cpu_limit", "memory_limit", "disk_limit", "output_limit", "killed"]
"""How an exec ended; the exact rules are in ``exec_server.py``'s module docstring:

- ``ok``: exit code 0.
- ``error``: non-zero exit not explained by a limit (including a command that cannot be run: 127).
- ``timeout``: the wall-clock limit ran out; every process of the exec was SIGKILLed.
- ``cpu_limit``: killed by RLIMIT_CPU (SIGXCPU, or SIGKILL at the hard limit).
- ``memory_limit``: an allocation refused by RLIMIT_AS (the command said so in stderr and failed),
  or (docker) the container's memory cgroup OOM-killed a process.
- ``disk_limit``: a size-capped tmpfs (/app, /tmp, /dev/shm) is full and the command failed, or
  RLIMIT_FSIZE stopped it (SIGXFSZ, or "File too large" in stderr).
- ``output_limit``: stdout+stderr passed ``sandbox.output_kill_bytes``; everything was SIGKILLed.
- ``killed``: terminated by a signal that no limit explains (``exit_code`` = -signal).
"""

SANDBOX_WORKDIR = "/app"  # Terminal-Bench's convention: tasks and tests use absolute /app paths
SANDBOX_SITE = "/opt/harnessrl/site"
NOBODY = 65534
SERVER_SOURCE = (Path(__file__).with_name("exec_server.py")).read_text()
_KILL_NOTES = {
    "timeout": "[killed: time limit]",
    "cpu_limit": "[killed: CPU time limit]",
    "memory_limit": "[failed: memory limit]",
    "disk_limit": "[failed: disk limit]",
    "output_limit": "[killed: output limit]",
}


@dataclass(frozen=True)
class ExecResult:
    """What one command did.

    ``status``: see :data:`ExecStatus`. ``exit_code``: the exit status, ``-signal`` when a signal
    ended it, None when the sandbox killed it (``timeout``, ``output_limit``). ``stdout`` /
    ``stderr``: decoded UTF-8 (replacement chars), each cut to ``sandbox.output_bytes`` bytes;
    ``truncated`` True when anything was cut. ``wall_s``: seconds from start to the end of the
    command (measured inside the sandbox). ``detail``: what the sandbox did besides running it
    (leftover processes killed, an OOM kill), empty when nothing.
    """

    status: ExecStatus
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    truncated: bool = False
    detail: str = ""

    def combined_output(self) -> str:
        """stdout, then stderr (newline between when both are non-empty), then a bracketed note
        when a limit ended the command, e.g. ``[killed: time limit]``."""
        out = self.stdout + (("\n" if self.stdout and self.stderr else "") + self.stderr if self.stderr else "")
        note = _KILL_NOTES.get(self.status)
        if note:
            out += ("\n" if out else "") + note
        return out


class Sandbox(Protocol):
    """One isolated workspace for one episode. Paths are relative to the work dir ``/app``."""

    def exec(self, argv: list[str], *, stdin: str | bytes | None = None, timeout_s: float | None = None) -> ExecResult: ...

    def write_file(self, path: str, data: bytes | str) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def cleanup(self) -> None: ...


def server_config(cfg: SandboxConfig, *, site: bool, nproc: bool) -> str:
    """The exec server's configuration (JSON, its argv[1]): work dir, environment of commands,
    per-command rlimits (bytes, seconds, counts), output caps (bytes), the tmpfs paths to watch.
    ``nproc``: set RLIMIT_NPROC (bwrap; docker uses the pids cgroup instead, since without a user
    namespace that limit would count every uid-65534 process on the host)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_WORKDIR, "TMPDIR": "/tmp",
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if site:
        env["PYTHONPATH"] = SANDBOX_SITE
    mib = 1024 * 1024
    return json.dumps({
        "workdir": SANDBOX_WORKDIR, "env": env,
        "limits": {"as": cfg.memory_mb * mib, "cpu": cfg.cpu_s, "fsize": cfg.file_size_mb * mib,
                   "nofile": cfg.max_open_files, "nproc": cfg.max_procs if nproc else None},
        "out_keep": cfg.output_bytes, "out_kill": cfg.output_kill_bytes,
        "disk_paths": [SANDBOX_WORKDIR, "/tmp", "/dev/shm"],
    }, sort_keys=True)


class ServerSandbox(abc.ABC):
    """Host side of the exec server protocol; a backend supplies the transport
    (:meth:`_send_bytes`, :meth:`_recv_bytes`) and :meth:`_stop`.

    Replies must come within the command's timeout plus ``_GRACE_S`` seconds; a server that does
    not answer, or whose stream ends, makes the sandbox dead: the backend is stopped and this and
    every later call raise :class:`SandboxError`.
    """

    _GRACE_S = 15.0

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self._closed = False
        self._dead: str | None = None

    # -- transport, implemented by the backends ------------------------------------------------
    @abc.abstractmethod
    def _send_bytes(self, data: bytes) -> None:
        """Write ``data`` to the server's stdin."""

    @abc.abstractmethod
    def _recv_bytes(self, n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes of the server's stdout by ``deadline`` (``time.monotonic``);
        TimeoutError or EOFError otherwise."""

    @abc.abstractmethod
    def _stop(self) -> None:
        """End the server and everything in the sandbox (idempotent)."""

    def _diagnostics(self) -> str:
        return ""

    # -- protocol --------------------------------------------------------------------------------
    def __enter__(self) -> "ServerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    @property
    def alive(self) -> bool:
        """True until :meth:`cleanup` or until the sandbox died."""
        return not self._closed and self._dead is None

    def _call(self, req: dict[str, Any], budget_s: float) -> dict[str, Any]:
        import time

        if self._closed:
            raise SandboxError("sandbox already cleaned up")
        if self._dead is not None:
            raise SandboxError(f"sandbox is dead: {self._dead}")
        body = json.dumps(req).encode()
        deadline = time.monotonic() + budget_s
        try:
            self._send_bytes(struct.pack(">Q", len(body)) + body)
            (n,) = struct.unpack(">Q", self._recv_bytes(8, deadline))
            reply = json.loads(self._recv_bytes(n, deadline))
        except (OSError, EOFError, TimeoutError, ValueError, struct.error) as e:
            self._dead = f"the exec server failed during {req.get('op')!r}: {type(e).__name__}: {e}"
            diag = self._diagnostics()
            self._stop()
            raise SandboxError(self._dead + (f"; server stderr: {diag[-500:]}" if diag else "")) from e
        if not reply.get("ok"):
            kind, msg = reply.get("kind"), reply.get("msg", "")
            if kind == "path":
                raise SandboxPathError(msg)
            if kind == "os":
                raise OSError(reply.get("errno") or 0, msg)
            raise SandboxError(f"the exec server refused {req.get('op')!r}: {msg}")
        return reply

    def exec(self, argv: list[str], *, stdin: str | bytes | None = None, timeout_s: float | None = None) -> ExecResult:
        """Run ``argv`` in the sandbox (cwd ``/app``, uid 65534, the configured rlimits).

        ``stdin``: bytes or text (UTF-8) fed to the command, None for /dev/null. ``timeout_s``:
        wall-clock seconds (default ``sandbox.wall_s``). Every process the command started is
        SIGKILLed when it ends. Raises SandboxError when the sandbox is not usable (cleaned up,
        dead) or its server failed; ValueError for an empty ``argv`` or a non-positive timeout.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        timeout = float(timeout_s if timeout_s is not None else self.cfg.wall_s)
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        r = self._call({"op": "exec", "argv": list(argv), "timeout": timeout,
                        "stdin": None if data is None else base64.b64encode(data).decode()},
                       timeout + self._GRACE_S)
        return ExecResult(
            status=r["status"], exit_code=r["exit_code"],
            stdout=base64.b64decode(r["stdout"]).decode("utf-8", errors="replace"),
            stderr=base64.b64decode(r["stderr"]).decode("utf-8", errors="replace"),
            wall_s=float(r["wall_s"]), truncated=bool(r["truncated"]), detail=r.get("detail", ""),
        )

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` (text is UTF-8 encoded) to ``/app/<path>`` (mode 0644, owner 65534),
        creating parent folders. Raises SandboxPathError for a refused path (absolute, ``..``,
        any symlink along it, not a regular file); OSError (e.g. ENOSPC when the work dir's
        ``workdir_mb`` is full); SandboxError when the sandbox is not usable."""
        _check_rel(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._call({"op": "write", "path": path, "data": base64.b64encode(raw).decode()}, self._GRACE_S + len(raw) / 2e7)

    def read_file(self, path: str) -> bytes:
        """The bytes of the regular file ``/app/<path>`` (at most ``workdir_mb`` MiB). Raises
        SandboxPathError for a refused path (see :meth:`write_file`), FileNotFoundError (an
        OSError) when it does not exist, SandboxError when the sandbox is not usable."""
        _check_rel(path)
        r = self._call({"op": "read", "path": path, "limit": self.cfg.workdir_mb * 1024 * 1024}, self._GRACE_S)
        return base64.b64decode(r["data"])

    def cleanup(self) -> None:
        """End the sandbox: every process (or the container) killed, its tmpfs freed. Idempotent."""
        if not self._closed:
            self._closed = True
            self._stop()


def _check_rel(path: str) -> None:
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise SandboxPathError(f"path {path!r} must be a non-empty path relative to {SANDBOX_WORKDIR}")
    if any(p == ".." for p in path.split("/")):
        raise SandboxPathError(f"path {path!r} escapes the sandbox work dir {SANDBOX_WORKDIR}")


def sandbox_site() -> Path | None:
    """The folder of Python packages (pytest) the bootstrap installs for the sandbox's Python,
    ``<venv>/sandbox-site``, or None when it is missing."""
    p = Path(sys.prefix) / "sandbox-site"
    return p if p.is_dir() else None
