"""The exec server that runs INSIDE a sandbox (both backends) as its process 1, stdlib only.

It is started once per episode as ``python3 -I -S -c <this file's source> <config JSON>`` and
serves requests from the host over its stdin/stdout until stdin closes. Nothing here is imported
by the host; the host only reads this file's text (:data:`SOURCE` in ``base.py``).

Wire format, both directions: an 8-byte big-endian length, then that many bytes of UTF-8 JSON.
Binary payloads are base64. Requests and replies:

- ``{"op": "ping"}`` -> ``{"ok": true}``
- ``{"op": "exec", "argv": [str], "stdin": b64|null, "timeout": seconds}`` ->
  ``{"ok": true, "status", "exit_code", "signal", "stdout": b64, "stderr": b64, "truncated",
  "wall_s", "cpu_s", "leftovers", "detail"}``
- ``{"op": "write", "path": rel, "data": b64}`` -> ``{"ok": true, "bytes": n}``
- ``{"op": "read", "path": rel, "limit": bytes}`` -> ``{"ok": true, "data": b64}``
- failures: ``{"ok": false, "kind": "path"|"os"|"bad_request", "errno": int|null, "msg": str}``

Why process 1: the kernel delivers no signal to a pid namespace's init from inside the namespace
unless init installed a handler for it, so commands cannot kill (SIGKILL, SIGSTOP) the server;
the server also makes itself non-dumpable, so commands of the same uid can neither ptrace it nor
open ``/proc/1/fd`` (its pipes to the host) or ``/proc/1/environ``. Every command runs in its own
session with resource limits; when it ends (or hits the wall clock, or floods output) the server
SIGKILLs every other process in the namespace (``kill(-1)`` from init reaches all of them) and
reaps them all, so no process outlives its exec and the namespace holds only the server between
execs (which also makes path checks in write/read free of races).

Status of an exec (the first rule that matches):

1. ``timeout``: the wall clock ran out; everything was killed; ``exit_code`` None.
2. ``output_limit``: stdout+stderr passed ``out_kill`` bytes; everything was killed; ``exit_code`` None.
3. Killed by a signal (``exit_code`` = -signal): SIGXCPU, or SIGKILL after using >= ``cpu`` CPU
   seconds -> ``cpu_limit`` (RLIMIT_CPU soft/hard); SIGXFSZ -> ``disk_limit`` (RLIMIT_FSIZE);
   SIGKILL while the memory cgroup's ``oom_kill`` counter rose -> ``memory_limit`` (docker only:
   the cgroup file is visible there); SIGSEGV/SIGABRT/SIGBUS with an out-of-memory message in
   stderr -> ``memory_limit``; any other signal -> ``killed``.
4. Exit 0 -> ``ok``.
5. Non-zero exit: a size-capped tmpfs (/app, /tmp, /dev/shm) became full during the exec, or the
   stderr tail says "No space left on device" / "File too large" / "Disk quota exceeded" ->
   ``disk_limit``; the ``oom_kill`` counter rose, or the stderr tail says MemoryError / "Cannot
   allocate memory" / "bad_alloc" / "memory exhausted" / "out of memory" -> ``memory_limit``;
   otherwise ``error``. (The stderr rules read the command's own words: a command can fake
   them, which only mislabels its own result; the tmpfs and cgroup rules cannot be faked.)
"""

import base64
import errno
import json
import os
import resource
import selectors
import signal
import stat
import struct
import sys
import time

CFG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
WORKDIR = CFG.get("workdir", "/app")
ENV = CFG.get("env", {"PATH": "/usr/local/bin:/usr/bin:/bin"})
LIMITS = CFG.get("limits", {})
OUT_KEEP = int(CFG.get("out_keep", 4096))
OUT_KILL = int(CFG.get("out_kill", 1 << 20))
DISK_PATHS = CFG.get("disk_paths", [WORKDIR])
TAIL = max(4096, OUT_KEEP)  # bytes of each stream's end kept (status rules, the kept tail)
CUT = b"\n...[output cut]...\n"
MEM_WORDS = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"memory exhausted", b"out of memory")
DISK_WORDS = (b"No space left on device", b"File too large", b"Disk quota exceeded")

IN_FD = os.dup(0)
OUT_FD = os.dup(1)


def _harden() -> None:
    """Non-dumpable (no ptrace, no /proc/1/fd by same-uid commands); default signal actions, so
    that as pid 1 no signal from inside the namespace is delivered; std fds on /dev/null."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception as e:  # noqa: BLE001 - report, the host decides
        sys.stderr.write(f"harnessrl-sandbox-server: PR_SET_DUMPABLE failed: {e}\n")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    os.set_inheritable(IN_FD, False)
    os.set_inheritable(OUT_FD, False)


def _read_exact(n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(IN_FD, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _send(obj: dict) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack(">Q", len(data)) + data
    view = memoryview(msg)
    while view:
        n = os.write(OUT_FD, view)
        view = view[n:]


def _oom_count() -> int | None:
    """The container memory cgroup's oom_kill counter (cgroup v2 or v1), None when not visible."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except OSError:
            continue
    return None


def _full_disks() -> set:
    """The watched tmpfs paths with no free block left."""
    full = set()
    for p in DISK_PATHS:
        try:
            if os.statvfs(p).f_bavail == 0:
                full.add(p)
        except OSError:
            pass
    return full


def _kill_all(main_pid: int, main_status: list) -> int:
    """SIGKILL every process in the namespace but this one and reap them all; the main child's
    wait status/rusage lands in ``main_status`` if reaped here. Returns how many were reaped."""
    reaped = 0
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            pid, st, ru = os.wait4(-1, 0)
        except ChildProcessError:
            return reaped
        except InterruptedError:
            continue
        if pid == main_pid:
            main_status[:] = [st, ru]
        else:
            reaped += 1


def _child(argv: list, in_r: int | None, out_w: int, err_w: int, errpipe: int) -> None:
    """In the forked child: own session, limits, cwd, fds; then exec. Never returns."""
    try:
        os.setsid()
        for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        if in_r is None:
            in_r = os.open("/dev/null", os.O_RDONLY)
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, errpipe)
        os.closerange(errpipe + 1, 65536)
        lim = LIMITS
        if lim.get("as"):
            resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
        if lim.get("cpu"):
            resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
        if lim.get("fsize"):
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
        if lim.get("nofile"):
            resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
        if lim.get("nproc"):
            resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(WORKDIR)
        os.execvpe(argv[0], argv, ENV)
    except BaseException as e:  # noqa: BLE001 - reported to the parent through errpipe
        msg = f"{getattr(e, 'errno', 0) or 0}:{type(e).__name__}: {e}".encode()
        try:
            os.write(errpipe, msg)
        finally:
            os._exit(127)


def do_exec(req: dict) -> dict:
    argv = req["argv"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        return {"ok": False, "kind": "bad_request", "errno": None, "msg": f"argv must be a non-empty list of strings, got {argv!r}"}
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None
    timeout = float(req["timeout"])
    oom0 = _oom_count()
    full0 = _full_disks()
    in_r = in_w = None
    if stdin is not None:
        in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    errpipe_r, errpipe_w = os.pipe2(os.O_CLOEXEC)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, in_r, out_w, err_w, errpipe_w)
    for fd in (in_r, out_w, err_w, errpipe_w):
        if fd is not None:
            os.close(fd)
    exec_err = b""
    while True:
        chunk = os.read(errpipe_r, 4096)
        if not chunk:
            break
        exec_err += chunk
    os.close(errpipe_r)

    sel = selectors.DefaultSelector()
    keep = {out_r: bytearray(), err_r: bytearray()}
    tails = {out_r: b"", err_r: b""}
    sizes = {out_r: 0, err_r: 0}
    total = 0
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin) if stdin is not None else None
    if in_w is not None:
        os.set_blocking(in_w, False)
        if pending:
            sel.register(in_w, selectors.EVENT_WRITE)
        else:
            os.close(in_w)
            in_w = None
    try:
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None
    main_status: list = []
    reason = None  # "timeout" | "output_limit" when the server killed the command
    deadline = t0 + timeout
    open_streams = 2
    leftovers = 0

    def pump(fd: int) -> int:
        nonlocal total, open_streams
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return -1
        if not data:
            sel.unregister(fd)
            open_streams -= 1
            return 0
        room = OUT_KEEP - len(keep[fd])
        if room > 0:
            keep[fd] += data[:room]
        tails[fd] = (tails[fd] + data)[-TAIL:]
        sizes[fd] += len(data)
        total += len(data)
        return len(data)

    while not main_status:
        if reason is None and pidfd is None:
            try:
                p, st, ru = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                p = 0
            if p == pid:
                main_status[:] = [st, ru]
                break
        now = time.monotonic()
        if now >= deadline:
            reason = "timeout"
            break
        wait = deadline - now if pidfd is not None else min(0.01, deadline - now)
        for key, ev in sel.select(wait):
            fd = key.fd
            if fd == pidfd:
                p, st, ru = os.wait4(pid, 0)
                main_status[:] = [st, ru]
            elif fd == in_w:
                try:
                    n = os.write(in_w, pending[:65536])
                    pending = pending[n:]
                except BlockingIOError:
                    n = 0
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(in_w)
                    os.close(in_w)
                    in_w = None
            else:
                pump(fd)
                if total > OUT_KILL:
                    reason = "output_limit"
                    break
        if reason:
            break
    # The command ended (or is being killed): every other process in the namespace goes too.
    leftovers = _kill_all(pid, main_status)
    wall = time.monotonic() - t0
    if in_w is not None:
        os.close(in_w)
    drain_until = time.monotonic() + 2.0
    while open_streams > 0 and time.monotonic() < drain_until:
        events = sel.select(0.1)
        for key, ev in events:
            if key.fd in keep:
                pump(key.fd)
    for fd in (out_r, err_r):
        os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    sel.close()
    st, ru = main_status
    cpu = ru.ru_utime + ru.ru_stime
    oom1 = _oom_count()
    oom = oom0 is not None and oom1 is not None and oom1 > oom0
    err_tail = tails[err_r]
    code = None
    sig = None
    detail = ""
    truncated = False
    for fd in (out_r, err_r):
        if sizes[fd] > OUT_KEEP:  # keep the head and the tail (where errors are), OUT_KEEP bytes in all
            truncated = True
            head = (OUT_KEEP - len(CUT)) // 2
            keep[fd] = keep[fd][:head] + CUT + tails[fd][-(OUT_KEEP - len(CUT) - head):]
    if exec_err:
        no, _, msg = exec_err.decode(errors="replace").partition(":")
        keep[err_r] += f"harnessrl-sandbox: cannot run {argv[0]!r}: {msg}\n".encode()
        code = 127
        status = "error"
    elif reason is not None:
        status = reason
    elif os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        code = -sig
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and LIMITS.get("cpu") and cpu >= LIMITS["cpu"] - 0.05):
            status = "cpu_limit"
        elif sig == signal.SIGXFSZ:
            status = "disk_limit"
        elif sig == signal.SIGKILL and oom:
            status = "memory_limit"
        elif sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS) and any(w in err_tail for w in MEM_WORDS):
            status = "memory_limit"
        else:
            status = "killed"
    else:
        code = os.WEXITSTATUS(st)
        if code == 0:
            status = "ok"
        elif (_full_disks() - full0) or any(w in err_tail for w in DISK_WORDS):
            status = "disk_limit"
        elif oom or any(w in err_tail for w in MEM_WORDS):
            status = "memory_limit"
        else:
            status = "error"
    if oom:
        detail += "the memory cgroup OOM-killed a process; "
    if leftovers:
        detail += f"{leftovers} leftover process(es) killed; "
    return {
        "ok": True, "status": status, "exit_code": code, "signal": sig,
        "stdout": base64.b64encode(bytes(keep[out_r])).decode(), "stderr": base64.b64encode(bytes(keep[err_r])).decode(),
        "truncated": truncated, "wall_s": wall, "cpu_s": cpu,
        "leftovers": leftovers, "detail": detail.rstrip("; "),
    }


class PathRefused(Exception):
    pass


def _walk(rel: str, create: bool) -> tuple[int, str]:
    """An fd of the parent directory of ``rel`` inside the work dir, and the final name. Refuses
    absolute paths, ``..``, empty components and any symlink along the way."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise PathRefused(f"path {rel!r} must be a non-empty relative path")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise PathRefused(f"path {rel!r} escapes the work dir")
    dfd = os.open(WORKDIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for p in parts[:-1]:
            try:
                st = os.stat(p, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(p, 0o755, dir_fd=dfd)
                st = os.stat(p, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise PathRefused(f"path {rel!r}: {p!r} is a symlink (refused: it could leave the work dir)")
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, f"{p!r} is not a directory", rel)
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
    except BaseException:
        os.close(dfd)
        raise
    return dfd, parts[-1]


def do_write(req: dict) -> dict:
    data = base64.b64decode(req["data"])
    dfd, name = _walk(req["path"], create=True)
    try:
        try:
            mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise PathRefused(f"path {req['path']!r} is a symlink (refused)")
            if not stat.S_ISREG(mode):
                raise PathRefused(f"path {req['path']!r} is not a regular file")
        except FileNotFoundError:
            pass
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"path {req['path']!r} is not a regular file")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return {"ok": True, "bytes": len(data)}


def do_read(req: dict) -> dict:
    limit = int(req["limit"])
    dfd, name = _walk(req["path"], create=False)
    try:
        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise PathRefused(f"path {req['path']!r} is a symlink (refused)")
        if not stat.S_ISREG(mode):
            raise PathRefused(f"path {req['path']!r} is not a regular file")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"path {req['path']!r} is not a regular file")
        chunks = []
        size = 0
        while True:
            c = os.read(fd, 1 << 20)
            if not c:
                break
            chunks.append(c)
            size += len(c)
            if size > limit:
                raise PathRefused(f"path {req['path']!r} is larger than the read limit of {limit} bytes")
    finally:
        os.close(fd)
    return {"ok": True, "data": base64.b64encode(b"".join(chunks)).decode()}


def main() -> None:
    _harden()
    ops = {"exec": do_exec, "write": do_write, "read": do_read, "ping": lambda req: {"ok": True}}
    while True:
        try:
            (n,) = struct.unpack(">Q", _read_exact(8))
            req = json.loads(_read_exact(n))
        except EOFError:
            break
        try:
            op = ops.get(req.get("op"))
            if op is None:
                reply = {"ok": False, "kind": "bad_request", "errno": None, "msg": f"unknown op {req.get('op')!r}"}
            else:
                reply = op(req)
        except PathRefused as e:
            reply = {"ok": False, "kind": "path", "errno": None, "msg": str(e)}
        except OSError as e:
            reply = {"ok": False, "kind": "os", "errno": e.errno, "msg": f"{e.strerror or e}: {req.get('path', '')!r}"}
        except (KeyError, ValueError, TypeError) as e:
            reply = {"ok": False, "kind": "bad_request", "errno": None, "msg": f"{type(e).__name__}: {e}"}
        _send(reply)
    _kill_all(-2, [])


if __name__ == "__main__":
    main()
