"""A battery of hostile snippets, each run in a fresh sandbox of each backend.

Every case asserts (1) the status the sandbox reports, (2) that nothing escaped (no host file,
host process, host connection, host secret seen), and, for every case, the fixture checks
(3) that nothing outlived its exec (only the exec server is left in the sandbox afterwards),
(4) that the sandbox is still usable (``echo alive``), and (5) that cleanup leaves no process
(bwrap: nothing left in its pid namespace) and no container (docker: none with its label).
Limits are small so the battery is quick: wall 2 s, CPU 1 s, 256 MiB address space, 16 MiB
work dir and /tmp, 12 MiB per file, 32 processes, 64 open files, 256 KiB of output.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable

import pytest

from tasks.config import SandboxConfig
from tasks.environments.sandbox import SandboxPathError, make_sandbox
from tests.facilities import bwrap_missing, docker_missing, require

LIMITS = dict(wall_s=2, cpu_s=1, memory_mb=256, workdir_mb=16, tmp_mb=16, file_size_mb=12, output_bytes=2000,
              output_kill_bytes=256 * 1024, max_procs=32, max_open_files=64, cpus=1.0)
HOST_SECRET = "harnessrl-host-secret-" + uuid.uuid4().hex
CASES: dict[str, Callable] = {}


def case(fn: Callable) -> Callable:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


@pytest.fixture(params=["bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    require(f"sandbox backend {request.param}", bwrap_missing() if request.param == "bwrap" else docker_missing())
    return request.param


def _in_sandbox_procs(s) -> int:
    return len(s.host_pids()) if hasattr(s, "host_pids") else len(s.processes())


def _host_procs_with(token: str) -> list[int]:
    hits = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        hits.append(int(d))
            except OSError:
                pass
    return hits


def _assert_cleaned_up(s, backend: str) -> None:
    if backend == "bwrap":
        assert s._ns is not None
        deadline = time.monotonic() + 5
        while s.host_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.host_pids() == [], "processes left in the sandbox's pid namespace after cleanup"
    else:
        from tasks.environments.sandbox.docker_backend import LABEL, _client

        left = _client(None).containers.list(all=True, filters={"label": f"{LABEL}.id={s.id}"})
        assert left == [], f"container left after cleanup: {left}"


def _py(s, code: str, **kw):
    s.write_file("main.py", code)
    return s.exec(["python3", "main.py"], **kw)


# -- network -------------------------------------------------------------------------------------
@case
def case_net_tcp_connect(s, backend):
    r = _py(s, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert r.status == "error" and "Network is unreachable" in r.stderr, r


@case
def case_net_dns(s, backend):
    r = _py(s, "import socket\nprint(socket.getaddrinfo('example.com', 80))")
    assert r.status == "error" and "gaierror" in r.stderr, r


@case
def case_net_http(s, backend):
    r = _py(s, "import urllib.request\nurllib.request.urlopen('http://93.184.216.34/', timeout=1)")
    assert r.status == "error" and "URLError" in r.stderr and "unreachable" in r.stderr, r


@case
def case_net_host_loopback(s, backend):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = _py(s, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert r.status == "error" and "Connection refused" in r.stderr, r
        with selectors.DefaultSelector() as sel:  # select(2) cannot take a descriptor above 1023
            sel.register(srv, selectors.EVENT_READ)
            assert sel.select(0) == [], "the host's listener got a connection"
    finally:
        srv.close()


@case
def case_net_docker_socket(s, backend):
    r = _py(s, "import socket\nc = socket.socket(socket.AF_UNIX)\nc.connect('/var/run/docker.sock')")
    assert r.status == "error" and "FileNotFoundError" in r.stderr, r


@case
def case_net_raw_socket(s, backend):
    r = _py(s, "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)")
    assert r.status == "error" and "PermissionError" in r.stderr, r


# -- processes -----------------------------------------------------------------------------------
@case
def case_fork_bomb_python(s, backend):
    r = _py(s, "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
               "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print('stopped', n)")
    assert r.status == "ok" and r.stdout.split()[0] == "stopped", r
    assert int(r.stdout.split()[1]) < LIMITS["max_procs"] + 1  # the process limit held
    assert "leftover" in r.detail


@case
def case_fork_bomb_shell(s, backend):
    r = s.exec(["bash", "-c", "f(){ f | f & }; f; sleep 0.5"])
    # bash returns, or, on a loaded host, is still retrying failed forks with its backoff at the
    # wall limit ("fork: retry"); either way the bomb is killed and the sandbox is usable after it
    assert r.status == "ok" or (r.status == "timeout" and "leftover" in r.detail), r
    after = s.exec(["bash", "-c", "echo alive"])
    assert after.status == "ok" and after.stdout.strip() == "alive", after


@case
def case_orphan_double_fork_setsid(s, backend):
    token = str(10_000 + uuid.uuid4().int % 80_000)
    r = _py(s, "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               f"        os.execvp('sleep', ['sleep', '{token}'])\n    os._exit(0)\ntime.sleep(0.2)\nprint('parent done')")
    assert r.status == "ok" and "leftover" in r.detail, r
    assert _host_procs_with(f"sleep\0{token}") == []


@case
def case_orphan_nohup(s, backend):
    token = str(10_000 + uuid.uuid4().int % 80_000)
    r = s.exec(["bash", "-c", f"nohup sleep {token} >/dev/null 2>&1 & disown; sleep 0.2; echo started"])
    assert r.status == "ok" and r.stdout == "started\n", r
    assert _host_procs_with(f"sleep\0{token}") == []


@case
def case_orphan_stopped(s, backend):
    r = s.exec(["bash", "-c", "(kill -STOP $BASHPID; sleep 1000) & sleep 0.2; echo ok"])
    assert r.status == "ok", r


@case
def case_orphan_after_timeout(s, backend):
    token = str(10_000 + uuid.uuid4().int % 80_000)
    t0 = time.monotonic()
    r = s.exec(["bash", "-c", f"sleep {token} & sleep 60"], timeout_s=1)
    assert r.status == "timeout" and r.exit_code is None and time.monotonic() - t0 < 3, r
    assert _host_procs_with(f"sleep\0{token}") == []


@case
def case_kill_parent(s, backend):
    r = _py(s, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(os.getppid())")
    assert r.status == "ok" and r.stdout.strip() == "1", r  # the parent is the server, pid 1: immune


@case
def case_kill_pid1_every_signal(s, backend):
    r = _py(s, "import os, signal\nfor sig in range(1, 32):\n    try:\n        os.kill(1, sig)\n"
               "    except OSError as e:\n        print(sig, e)\nprint('sent')")
    assert r.status == "ok" and r.stdout.strip().endswith("sent"), r


@case
def case_kill_everything(s, backend):
    r = s.exec(["bash", "-c", "sleep 100 & kill -9 -1; echo still-here"])
    assert r.status == "ok" and "still-here" in r.stdout, r


@case
def case_signal_host_processes(s, backend):
    host = subprocess.Popen(["sleep", "300"], preexec_fn=_as_nobody if os.geteuid() == 0 else None)
    try:
        r = _py(s, f"import os\nhit = []\nfor pid in list(range(2, 4096)) + [{host.pid}, {os.getpid()}]:\n"
                   "    if pid == os.getpid():\n        continue\n"
                   "    try:\n        os.kill(pid, 9)\n        hit.append(pid)\n    except OSError:\n        pass\n"
                   "print('hit', hit)")
        assert r.status == "ok" and r.stdout.strip() == "hit []", r
        assert host.poll() is None, "a host process (same uid 65534) was killed from the sandbox"
    finally:
        host.kill()
        host.wait()


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


@case
def case_fake_protocol_reply(s, backend):
    r = _py(s, "import sys, struct, json\nb = json.dumps({'ok': True, 'status': 'ok'}).encode()\n"
               "sys.stdout.buffer.write(struct.pack('>Q', len(b)) + b)\nsys.exit(3)")
    assert r.status == "error" and r.exit_code == 3 and '"status": "ok"' in r.stdout, r


# -- time and CPU ----------------------------------------------------------------------------------
@case
def case_infinite_loop(s, backend):
    r = _py(s, "while True:\n    pass", timeout_s=8)  # slack for a loaded machine: 1 CPU second is the limit
    assert r.status == "cpu_limit" and r.exit_code == -signal.SIGXCPU, r


@case
def case_long_sleep(s, backend):
    t0 = time.monotonic()
    r = s.exec(["sleep", "100"], timeout_s=1)
    assert r.status == "timeout" and 0.9 < r.wall_s < 1.6 and time.monotonic() - t0 < 3, r


@case
def case_cpu_burn_threads(s, backend):
    r = _py(s, "import hashlib, threading\nbuf = b'x' * (8 << 20)\n"
               "def burn():\n    while True:\n        hashlib.sha256(buf).digest()\n"
               "for _ in range(4):\n    threading.Thread(target=burn).start()\n", timeout_s=8)
    assert r.status == "cpu_limit", r  # RLIMIT_CPU counts every thread of the process


@case
def case_cpu_burn_processes(s, backend):
    r = s.exec(["bash", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; wait"], timeout_s=1)
    assert r.status == "timeout", r


# -- memory --------------------------------------------------------------------------------------
@case
def case_memory_bomb_one_block(s, backend):
    r = _py(s, "x = bytearray(2 << 30)")
    assert r.status == "memory_limit" and "MemoryError" in r.stderr, r


@case
def case_memory_bomb_growing(s, backend):
    r = _py(s, "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))")
    assert r.status == "memory_limit", r


@case
def case_memory_many_processes(s, backend):
    # 4 x 120 MiB, each under RLIMIT_AS; only a cgroup bounds the sum (docker: 368 MiB).
    r = _py(s, "import os, sys\npids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
               "        x = b'x' * (120 << 20)\n        import time; time.sleep(0.5)\n        os._exit(0)\n    pids.append(pid)\n"
               "bad = [os.waitpid(p, 0)[1] for p in pids]\nsys.exit(1 if any(bad) else 0)")
    assert r.status == {"bwrap": "ok", "docker": "memory_limit"}[backend], r


@case
def case_zip_bomb_to_memory(s, backend):
    s.write_file("bomb.z", _bomb())
    r = _py(s, "import zlib\ndata = zlib.decompress(open('bomb.z', 'rb').read())\nbig = data * 8")
    assert r.status == "memory_limit", r


# -- disk ----------------------------------------------------------------------------------------
@case
def case_disk_fill_workdir(s, backend):
    r = s.exec(["bash", "-c", "dd if=/dev/zero of=a bs=1M count=10 && dd if=/dev/zero of=b bs=1M count=10"])
    assert r.status == "disk_limit" and "No space left" in r.stderr, r
    r = s.exec(["bash", "-c", "rm a b && echo freed"])
    assert r.status == "ok" and r.stdout == "freed\n", r  # usable again once the agent cleans up


@case
def case_disk_fill_tmp(s, backend):
    r = s.exec(["bash", "-c", "dd if=/dev/zero of=/tmp/a bs=1M count=10 && dd if=/dev/zero of=/tmp/b bs=1M count=10"])
    assert r.status == "disk_limit" and "No space left" in r.stderr, r


@case
def case_disk_fill_dev_shm(s, backend):
    r = s.exec(["bash", "-c", "dd if=/dev/zero of=/dev/shm/a bs=1M count=10 && dd if=/dev/zero of=/dev/shm/b bs=1M count=10"])
    assert r.status == "disk_limit" and "No space left" in r.stderr, r


@case
def case_disk_many_small_files_python(s, backend):
    r = _py(s, "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 65536)\n    i += 1")
    assert r.status == "disk_limit" and "No space left" in r.stderr, r


@case
def case_file_size_limit(s, backend):
    r = s.exec(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=64"])
    assert r.status == "disk_limit" and r.exit_code == -signal.SIGXFSZ, r


@case
def case_sparse_huge_file(s, backend):
    r = _py(s, "with open('sparse', 'wb') as f:\n    f.truncate(10 ** 12)")
    assert r.status == "disk_limit" and "File too large" in r.stderr, r


@case
def case_zip_bomb_to_disk(s, backend):
    s.write_file("bomb.z", _bomb())
    r = _py(s, "import zlib\nd = zlib.decompressobj()\nsrc = open('bomb.z', 'rb')\nwith open('out', 'wb') as f:\n"
               "    while chunk := src.read(65536):\n        f.write(d.decompress(chunk))")
    assert r.status == "disk_limit", r


_BOMB: list[bytes] = []


def _bomb() -> bytes:
    """64 MiB of zeros, deflated (~0.3 MB)."""
    if not _BOMB:
        c = zlib.compressobj(1)
        z = bytes(1 << 20)
        _BOMB.append(b"".join(c.compress(z) for _ in range(64)) + c.flush())
    return _BOMB[0]


# -- host files and secrets ------------------------------------------------------------------------
@case
def case_read_shadow(s, backend):
    r = _py(s, "print(open('/etc/shadow').read())")
    assert r.status == "error" and "No such file" in r.stderr, r


@case
def case_read_root_home(s, backend):
    r = _py(s, "import os\nprint(os.listdir('/root'))")
    assert r.status == "error" and ("No such file" in r.stderr or "Permission denied" in r.stderr), r


@case
def case_host_env_and_proc_environ(s, backend):
    r = s.exec(["bash", "-c", "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; echo done"])
    assert r.status == "ok" and r.stdout.endswith("done\n") and HOST_SECRET not in r.stdout, r


@case
def case_host_paths_invisible(s, backend):
    from pathlib import Path

    import tasks

    repo = str(Path(tasks.__file__).resolve().parents[1])
    paths = [repo, "/work", "/home", os.path.expanduser("~") + "/.bashrc", "/var/lib/harnessrl-docker",
             "/var/run/docker.sock", "/etc/ssh", tempfile.gettempdir() + "/pytest-of-root"]
    r = _py(s, f"import os\nprint([p for p in {paths!r} if os.path.exists(p)])")
    assert r.status == "ok" and r.stdout.strip() == "[]", r


@case
def case_other_episode_invisible(s, backend):
    other = make_sandbox(SandboxConfig(backend=backend, **LIMITS))
    token = uuid.uuid4().hex
    try:
        other.write_file(f"secret-{token}.txt", token)
        assert other.exec(["bash", "-c", f"cp secret-{token}.txt /tmp/; echo {token} > /dev/shm/s"]).status == "ok"
        r = s.exec(["bash", "-c", "ls -a /app /tmp /dev/shm; grep -rs . /app /tmp /dev/shm; true"])
        assert r.status == "ok" and token not in r.stdout, r
        r = _py(s, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])")
        assert r.stdout == "True\n", r  # only the server and this process: no other episode's
        assert other.read_file(f"secret-{token}.txt") == token.encode()
    finally:
        other.cleanup()


@case
def case_write_usr(s, backend):
    name = f"harnessrl-evil-{uuid.uuid4().hex}"
    r = _py(s, f"open('/usr/bin/{name}', 'w').write('x')")
    assert r.status == "error" and ("Read-only file system" in r.stderr or "Permission denied" in r.stderr), r
    assert not os.path.exists(f"/usr/bin/{name}")


@case
def case_write_etc(s, backend):
    r = _py(s, "open('/etc/harnessrl-evil', 'w').write('x')")
    assert r.status == "error", r
    assert not os.path.exists("/etc/harnessrl-evil")


@case
def case_write_root_dir(s, backend):
    r = _py(s, "open('/harnessrl-evil', 'w').write('x')")
    assert r.status == "error" and "Read-only file system" in r.stderr, r
    assert not os.path.exists("/harnessrl-evil")


@case
def case_private_tmp(s, backend):
    name = f"harnessrl-marker-{uuid.uuid4().hex}"
    r = s.exec(["bash", "-c", f"echo x > /tmp/{name} && echo wrote"])
    assert r.status == "ok" and r.stdout == "wrote\n", r
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(os.path.join(tempfile.gettempdir(), name))


@case
def case_symlink_escape_write(s, backend):
    assert s.exec(["bash", "-c", "ln -s / rootlink && ln -s /etc etclink && ln -s /tmp/x filelink"]).status == "ok"
    for path in ("rootlink/tmp/evil", "etclink/passwd", "filelink", "../evil", "/etc/evil", "a/../../evil"):
        with pytest.raises(SandboxPathError):
            s.write_file(path, "x")
    r = s.exec(["bash", "-c", "ls /tmp; ls -la"])
    assert "evil" not in r.stdout and r.stdout.count("->") == 3, r


@case
def case_symlink_escape_read(s, backend):
    assert s.exec(["bash", "-c", "ln -s /proc/1/environ env && ln -s /etc/passwd pw && ln -s /proc/1 p1"]).status == "ok"
    for path in ("env", "pw", "p1/environ", "../../etc/passwd", "/etc/passwd"):
        with pytest.raises(SandboxPathError):
            s.read_file(path)


@case
def case_fifo_as_result_file(s, backend):
    assert s.exec(["mkfifo", "out.txt"]).status == "ok"
    t0 = time.monotonic()
    with pytest.raises(SandboxPathError, match="not a regular file"):
        s.read_file("out.txt")
    with pytest.raises(SandboxPathError, match="not a regular file"):
        s.write_file("out.txt", "x")
    assert time.monotonic() - t0 < 2


# -- privileges and kernel interfaces --------------------------------------------------------------
@case
def case_sysrq(s, backend):
    r = _py(s, "open('/proc/sysrq-trigger', 'w').write('b')")
    assert r.status == "error", r


@case
def case_mount_tmpfs(s, backend):
    r = _py(s, "import ctypes, os, sys\nos.mkdir('m')\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "rc = libc.mount(b'none', b'/app/m', b'tmpfs', 0, None)\n"
               "print(rc, os.strerror(ctypes.get_errno()))\nsys.exit(rc != 0)")
    assert r.status == "error" and r.stdout.startswith("-1 "), r


@case
def case_nested_user_namespace(s, backend):
    r = _py(s, "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "rc = libc.unshare(0x10000000)\nprint(rc, os.strerror(ctypes.get_errno()))\nsys.exit(rc != 0)")
    assert r.status == "error" and r.stdout.startswith("-1 "), r


@case
def case_ptrace_server(s, backend):
    r = _py(s, "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "rc = libc.ptrace(16, 1, 0, 0)\nprint(rc, os.strerror(ctypes.get_errno()))\nsys.exit(rc != 0)")
    assert r.status == "error" and r.stdout.startswith("-1 "), r


@case
def case_server_fds_and_environ(s, backend):
    r = s.exec(["bash", "-c", "ls /proc/1/fd; cat /proc/1/environ; cat /proc/1/mem"])
    assert r.status == "error" and r.stderr.count("Permission denied") == 3, r


@case
def case_setuid_root(s, backend):
    r = _py(s, "import os\nos.setuid(0)")
    # PermissionError (docker), EINVAL (bwrap: uid 0 does not exist in the sandbox's user namespace)
    assert r.status == "error" and ("PermissionError" in r.stderr or "Invalid argument" in r.stderr), r


@case
def case_chmod_setuid_system_binary(s, backend):
    r = s.exec(["chmod", "4755", "/usr/bin/bash"])
    assert r.status == "error", r
    assert not os.stat("/usr/bin/bash").st_mode & 0o4000


@case
def case_setuid_bit_on_own_copy(s, backend):
    r = s.exec(["bash", "-c", "cp /usr/bin/python3.11 p && chmod 4755 p && ./p -c 'import os; print(os.geteuid())'"])
    assert r.status == "ok" and r.stdout.strip() == "65534", r


@case
def case_sethostname(s, backend):
    r = _py(s, "import socket\nsocket.sethostname('pwned')")
    assert r.status == "error" and "PermissionError" in r.stderr, r
    assert socket.gethostname() != "pwned"


@case
def case_raw_devices(s, backend):
    r = _py(s, "import os\nfor d in ('/dev/mem', '/dev/kmsg', '/dev/sda', '/dev/vda'):\n    try:\n"
               "        os.open(d, os.O_RDONLY)\n        print('opened', d)\n    except OSError:\n        pass")
    assert r.status == "ok" and "opened" not in r.stdout, r


@case
def case_many_open_files(s, backend):
    r = _py(s, "fs = [open('main.py') for _ in range(10000)]")
    assert r.status == "error" and "Too many open files" in r.stderr, r


# -- output and input ------------------------------------------------------------------------------
@case
def case_huge_output_stream(s, backend):
    r = s.exec(["yes"])
    assert r.status == "output_limit" and r.truncated and len(r.stdout) == LIMITS["output_bytes"], r
    assert r.stdout.startswith("y\ny\n") and "[output cut]" in r.stdout


@case
def case_huge_output_one_write(s, backend):
    r = _py(s, "print('x' * (10 << 20))")
    assert r.status == "output_limit" and r.truncated and r.exit_code is None, r


@case
def case_huge_stderr(s, backend):
    r = _py(s, "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)")
    assert r.status == "output_limit" and len(r.stderr) == LIMITS["output_bytes"], r


@case
def case_unread_stdin_flood(s, backend):
    r = s.exec(["sleep", "0.1"], stdin=b"z" * (8 << 20))
    assert r.status == "ok", r


# -- the test: every case above, on every backend (defined last, once CASES is full) -----------
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile(backend: str, name: str) -> None:
    os.environ["HARNESSRL_HOSTILE_SECRET"] = HOST_SECRET  # a host env var the sandbox must not see
    s = make_sandbox(SandboxConfig(backend=backend, **LIMITS))
    try:
        CASES[name](s, backend)
        assert _in_sandbox_procs(s) == 1, "a process outlived its exec"
        r = s.exec(["echo", "alive"])
        assert (r.status, r.stdout) == ("ok", "alive\n"), r
    finally:
        s.cleanup()
        os.environ.pop("HARNESSRL_HOSTILE_SECRET", None)
    _assert_cleaned_up(s, backend)
