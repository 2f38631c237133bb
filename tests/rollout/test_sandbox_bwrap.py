import os
import shutil
import time

import pytest

from tasks.config import SandboxConfig
from tasks.rollout.sandbox import make_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture
def sbx():
    s = make_sandbox(SandboxConfig(wall_s=3, cpu_s=2, memory_mb=256, output_bytes=2000, max_procs=32))
    yield s
    s.cleanup()
    assert not s.workdir.exists()


def run(s, code, **kw):
    s.write_file("main.py", code)
    return s.exec(["python3", "-I", "main.py"], **kw)


def test_runs_code_and_round_trips_files(sbx):
    r = run(sbx, "open('out.txt','w').write('hi'); print(6*7)")
    assert (r.status, r.exit_code, r.stdout.strip()) == ("ok", 0, "42")
    assert sbx.read_file("out.txt") == b"hi"


def test_no_network(sbx):
    r = run(sbx, "import socket\ns=socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 53))")
    assert r.status == "error" and "Network is unreachable" in r.stderr


def test_wall_time_limit_kills(sbx):
    t0 = time.monotonic()
    r = run(sbx, "import time\ntime.sleep(30)", timeout_s=1)
    assert r.status == "timeout" and time.monotonic() - t0 < 5


def test_cpu_limit(sbx):
    r = run(sbx, "while True: pass", timeout_s=10)
    assert r.status == "error" and r.exit_code != 0  # SIGXCPU after cpu_s=2


def test_memory_limit(sbx):
    r = run(sbx, "x = bytearray(600 * 1024 * 1024)")
    assert r.status == "error" and "MemoryError" in r.stderr


def test_process_limit_stops_a_fork_bomb(sbx):
    r = run(sbx, "import os\nn=0\ntry:\n    while True:\n        if os.fork()==0:\n            import time; time.sleep(5); os._exit(0)\n        n+=1\nexcept OSError:\n    print('stopped', n)")
    assert r.status == "ok", r
    assert r.stdout.split()[0] == "stopped" and int(r.stdout.split()[1]) < 32  # max_procs=32 held


def test_host_files_are_invisible_and_readonly(sbx):
    r = run(sbx, "import os\nprint(os.path.exists('/root'), os.path.exists('/etc/shadow'), os.getuid())\nopen('/usr/x','w')")
    assert r.stdout.split() == ["False", "False", "65534"] and "Read-only file system" in r.stderr


def test_output_is_capped(sbx):
    r = run(sbx, "print('x' * 100000)")
    assert r.truncated and len(r.stdout) == 2000


def test_path_escape_is_refused(sbx):
    from tasks.rollout.sandbox import SandboxError

    with pytest.raises(SandboxError, match="escapes"):
        sbx.write_file("../evil.py", "x")


def _procs_running(argv: list[str]) -> list[int]:
    want = ("\0".join(argv) + "\0").encode()
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if f.read() == want:
                        pids.append(int(d))
            except OSError:
                pass
    return pids


def test_no_process_outlives_the_sandbox(sbx):
    argv = ["sleep", "317"]
    r = run(sbx, f"import subprocess\nsubprocess.Popen({argv!r}, start_new_session=True)\nprint('spawned')")
    assert r.status == "ok" and r.stdout.strip() == "spawned"
    time.sleep(0.3)
    assert _procs_running(argv) == []


def test_orphans_are_killed_on_timeout_too(sbx):
    argv = ["sleep", "318"]
    r = run(sbx, f"import subprocess, time\nsubprocess.Popen({argv!r})\ntime.sleep(60)", timeout_s=1)
    assert r.status == "timeout"
    time.sleep(0.3)
    assert _procs_running(argv) == []
