"""bubblewrap backend: one long-lived bwrap process tree per episode.

Isolation: every namespace unshared (user, pid, net, ipc, uts, cgroup, mount), no nested user
namespaces (``--disable-userns``), bwrap's own root and ``/dev`` remounted read-only, the host's
``/usr`` read-only (with the ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` symlinks), a fresh ``/proc``,
size-capped tmpfs at ``/app`` (``workdir_mb``), ``/tmp`` and ``/dev/shm`` (``tmp_mb`` each), the
pytest site at ``/opt/harnessrl/site`` when the bootstrap made it, no inherited environment, no
capabilities, ``no_new_privs``. Inside, everything runs as uid/gid 65534; when the host process
is root, bwrap itself is started as host uid 65534 too (so the sandbox's uid maps to the host's
``nobody``, never to root). ``--die-with-parent`` ends the tree if the host process dies.

The exec server (``exec_server.py``) is the namespace's process 1 (``--as-pid-1``); requests go over
bwrap's stdin/stdout pipes, and replies are waited for with ``poll(2)`` (a ``PollSelector``
registered once per sandbox), which takes any descriptor number: ``select(2)`` refused the pipes
of the sandboxes opened once the process held 1,024 descriptors. A sandbox holds 3 descriptors in
the host process (``tasks/environments/sandbox/limits.py``). Memory is bounded per process (RLIMIT_AS)
and by the tmpfs sizes; no cgroup bounds the sum over processes (at most ``max_procs`` of them):
see the README's sandbox section. :meth:`BwrapSandbox.cleanup` SIGKILLs bwrap; the kernel then
kills every process of the pid namespace and frees the tmpfs with the mount namespace. No host
file is created.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from tasks.config import SandboxConfig
from tasks.environments.sandbox.base import (
    NOBODY,
    SANDBOX_SITE,
    SANDBOX_WORKDIR,
    SERVER_SOURCE,
    SandboxError,
    ServerSandbox,
    server_config,
    sandbox_site,
)

__all__ = ["BwrapSandbox", "sandbox_site", "SANDBOX_SITE", "SANDBOX_WORKDIR"]


def _bwrap() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxError("sandbox.backend=bwrap but the 'bwrap' binary is not installed (apt-get install bubblewrap)")
    return exe


class BwrapSandbox(ServerSandbox):
    """A bubblewrap sandbox for one episode, started by the constructor. Use as a context manager
    or call :meth:`cleanup`.

    Raises (constructor): SandboxError when bwrap is missing, cannot create namespaces here, or
    the exec server does not answer within 15 s.
    """

    def __init__(self, cfg: SandboxConfig):
        super().__init__(cfg)
        exe = _bwrap()
        site = sandbox_site()
        mib = 1024 * 1024
        argv = [
            exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/sbin", "/sbin",
            # Debian resolves awk, which, pager, ... through /etc/alternatives; only that folder of
            # the host's /etc is visible (no passwd, shadow, hosts or resolv.conf)
            *(["--ro-bind", "/etc/alternatives", "/etc/alternatives"] if os.path.isdir("/etc/alternatives") else []),
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(cfg.tmp_mb * mib), "--tmpfs", "/dev/shm",
            "--size", str(cfg.tmp_mb * mib), "--tmpfs", "/tmp",
            "--size", str(cfg.workdir_mb * mib), "--tmpfs", SANDBOX_WORKDIR,
            *(["--ro-bind", str(site), SANDBOX_SITE] if site else []),
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", SANDBOX_WORKDIR, "--clearenv",
            "--", "/usr/bin/python3", "-I", "-S", "-c", SERVER_SOURCE,
            server_config(cfg, site=site is not None, nproc=True),
        ]
        self._err = tempfile.TemporaryFile()  # the server's/bwrap's stderr, for error messages; unlinked
        try:
            as_nobody = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if os.geteuid() == 0 else {}
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, close_fds=True,
                start_new_session=True, **as_nobody,  # type: ignore[arg-type]
            )
        except OSError as e:
            self._err.close()
            raise SandboxError(f"bwrap failed to start: {e}") from e
        self._buf = bytearray()
        # one poll-based selector per sandbox, registered once: poll(2) takes any descriptor number
        # (select(2) stops at FD_SETSIZE = 1024, which hundreds of open sandboxes pass) and, unlike
        # epoll, holds no descriptor of its own
        assert self._proc.stdout is not None
        self._sel = selectors.PollSelector()
        self._sel.register(self._proc.stdout.fileno(), selectors.EVENT_READ)
        try:
            self._call({"op": "ping"}, 15.0)
        except SandboxError as e:
            self._closed = True
            raise SandboxError(f"the bwrap sandbox did not start: {e}") from None
        self.pid = self._proc.pid  # host pid of bwrap (outside the sandbox's namespaces)
        self._pidns()

    def _send_bytes(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _recv_bytes(self, n: int, deadline: float) -> bytes:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the exec server in time")
            if self._sel.select(left):
                chunk = os.read(fd, max(65536, n - len(self._buf)))
                if not chunk:
                    raise EOFError("the sandbox's exec server exited")
                self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _diagnostics(self) -> str:
        try:
            self._err.seek(0)
            return self._err.read(100_000).decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def _stop(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None:
            init = getattr(self, "_init_pid", None)
            if init is not None and proc.poll() is None:
                try:  # the sandbox's pid 1: its death takes the whole pid namespace; bwrap then exits
                    os.kill(init, signal.SIGKILL)
                    proc.wait(timeout=5)
                except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            proc.wait()
        sel = getattr(self, "_sel", None)
        if sel is not None:
            sel.close()
        self._err.close()

    def host_pids(self) -> list[int]:
        """Host pids of the processes in this sandbox's pid namespace (empty once cleaned up);
        for tests and leak checks. Reads ``/proc/*/ns/pid`` (Linux)."""
        ns = self._pidns()
        if ns is None:
            return []
        return _pids_in_ns(ns)

    def _pidns(self) -> str | None:
        if not hasattr(self, "_ns"):
            self._ns = None
            self._init_pid: int | None = None
            try:
                with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                    kids = f.read().split()
                if kids:
                    self._init_pid = int(kids[0])
                    self._ns = os.readlink(f"/proc/{kids[0]}/ns/pid")
            except OSError:
                pass
        return self._ns


def _pids_in_ns(ns: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/pid") == ns:
                    out.append(int(d))
            except OSError:
                pass
    return out
