"""bubblewrap sandbox: a fresh work dir per episode, no network, resource limits, wall timeout.

Isolation: every namespace unshared (net, pid, ipc, uts, user, cgroup), the host's ``/usr``
read-only, a private ``/tmp`` and ``/proc``, no environment inherited, the process run as the
unprivileged user ``nobody`` (uid 65534) so that per-user process limits hold. Limits
(``setrlimit`` before exec): address space, CPU seconds, file size, open files, processes. The
wall-clock limit kills the whole process group; bwrap's ``--die-with-parent`` and the pid
namespace take every descendant with it.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tasks.config import SandboxConfig
from tasks.rollout.sandbox.base import ExecResult, SandboxError

NOBODY = 65534
SANDBOX_WORKDIR = "/app"  # Terminal-Bench's convention: tasks and tests use absolute /app paths
SANDBOX_SITE = "/opt/harnessrl/site"


def sandbox_site() -> Path | None:
    """The folder of Python packages (pytest) the bootstrap installs for the sandbox's Python,
    ``<venv>/sandbox-site``, or None when it is missing."""
    import sys

    p = Path(sys.prefix) / "sandbox-site"
    return p if p.is_dir() else None


def _bwrap() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxError("sandbox.backend=bwrap but the 'bwrap' binary is not installed (apt-get install bubblewrap)")
    return exe


class BwrapSandbox:
    """A bubblewrap sandbox for one episode. Use as a context manager or call :meth:`cleanup`."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.exe = _bwrap()
        self.workdir = Path(tempfile.mkdtemp(prefix="harnessrl-sbx-"))
        os.chmod(self.workdir, 0o700)
        if os.geteuid() == 0:
            os.chown(self.workdir, NOBODY, NOBODY)
        self._closed = False

    def __enter__(self) -> "BwrapSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _host_path(self, path: str) -> Path:
        p = (self.workdir / path).resolve()
        if self.workdir.resolve() not in p.parents and p != self.workdir.resolve():
            raise SandboxError(f"path {path!r} escapes the sandbox work dir")
        return p

    def write_file(self, path: str, data: bytes | str) -> None:
        p = self._host_path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        if os.geteuid() == 0:
            os.chown(p, NOBODY, NOBODY)

    def read_file(self, path: str) -> bytes:
        return self._host_path(path).read_bytes()

    def _argv(self, argv: list[str]) -> list[str]:
        site = sandbox_site()
        cmd = [
            self.exe, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            *(["--ro-bind", str(site), SANDBOX_SITE] if site else []),
            "--bind", str(self.workdir), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR,
            "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", SANDBOX_WORKDIR,
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "LANG", "C.UTF-8",
            *(["--setenv", "PYTHONPATH", SANDBOX_SITE] if site else []),
            "--",
        ]
        return cmd + argv

    def _limits(self) -> None:  # runs in the child between fork and exec
        c = self.cfg
        mem = c.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (c.cpu_s, c.cpu_s))
        fsize = c.file_size_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (c.max_procs, c.max_procs))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    def exec(self, argv: list[str], *, stdin: str | None = None, timeout_s: float | None = None) -> ExecResult:
        """Run ``argv`` inside the sandbox (cwd = the work dir).

        ``timeout_s`` (seconds, default the config's ``wall_s``) bounds wall time; output beyond
        ``output_bytes`` per stream is cut. Raises SandboxError when bwrap cannot start.
        """
        if self._closed:
            raise SandboxError("sandbox already cleaned up")
        limit = self.cfg.output_bytes
        timeout = timeout_s if timeout_s is not None else self.cfg.wall_s
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    self._argv(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=out, stderr=err, preexec_fn=self._limits, start_new_session=True, close_fds=True,
                )
            except OSError as e:
                raise SandboxError(f"bwrap failed to start: {e}") from e
            timed_out = False
            try:
                if stdin is not None:
                    try:
                        proc.stdin.write(stdin.encode())  # type: ignore[union-attr]
                        proc.stdin.close()  # type: ignore[union-attr]
                    except BrokenPipeError:
                        pass
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            wall = time.monotonic() - t0
            stdout, t1 = _read_capped(out, limit)
            stderr, t2 = _read_capped(err, limit)
        if proc.returncode is not None and proc.returncode != 0 and "bwrap:" in stderr[:200] and not timed_out:
            if "Creating new namespace failed" in stderr or "setting up uid map" in stderr:
                raise SandboxError(f"bwrap cannot create namespaces here: {stderr.strip()[:300]}")
        status = "timeout" if timed_out else ("ok" if proc.returncode == 0 else "error")
        return ExecResult(status=status, exit_code=None if timed_out else proc.returncode, stdout=stdout,
                          stderr=stderr, wall_s=wall, truncated=t1 or t2)

    def cleanup(self) -> None:
        """Remove the work dir. Idempotent."""
        if not self._closed:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._closed = True


def _read_capped(f: "tempfile._TemporaryFileWrapper[bytes]", limit: int) -> tuple[str, bool]:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    data = f.read(limit)
    return data.decode("utf-8", errors="replace"), size > limit
