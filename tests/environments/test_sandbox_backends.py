"""The sandbox interface on every backend: one sandbox per episode, files persist across execs,
statuses, output caps, errors. Hostile input is in test_sandbox_hostile.py."""

from __future__ import annotations

import time

import pytest

from tasks.config import SandboxConfig
from tasks.environments.sandbox import ExecResult, SandboxError, SandboxPathError, make_sandbox
from tests.facilities import bwrap_missing, docker_missing, require

LIMITS = dict(wall_s=3, cpu_s=2, memory_mb=256, output_bytes=2000, max_procs=32, workdir_mb=16, tmp_mb=16)


@pytest.fixture(params=["bwrap", "docker"])
def sbx(request: pytest.FixtureRequest):
    require(f"sandbox backend {request.param}", bwrap_missing() if request.param == "bwrap" else docker_missing())
    s = make_sandbox(SandboxConfig(backend=request.param, **LIMITS))
    yield s
    s.cleanup()


def run(s, code, **kw):
    s.write_file("main.py", code)
    return s.exec(["python3", "-I", "main.py"], **kw)


def test_runs_code_and_round_trips_files(sbx):
    r = run(sbx, "open('out.txt','w').write('hi'); print(6*7)")
    assert (r.status, r.exit_code, r.stdout.strip()) == ("ok", 0, "42")
    assert sbx.read_file("out.txt") == b"hi"
    sbx.write_file("deep/er/data.bin", bytes(range(256)) * 100)
    assert sbx.read_file("deep/er/data.bin") == bytes(range(256)) * 100


def test_files_and_state_persist_across_execs_of_the_episode(sbx):
    assert sbx.exec(["bash", "-c", "mkdir -p pkg && echo 'X = 7' > pkg/mod.py && echo one > /tmp/t"]).status == "ok"
    r = sbx.exec(["python3", "-c", "import sys; sys.path.insert(0, '.'); from pkg.mod import X; print(X, open('/tmp/t').read().strip())"])
    assert r.stdout == "7 one\n", r


def test_executable_scripts_in_the_work_dir(sbx):
    sbx.write_file("run.sh", "#!/bin/sh\necho ran \"$1\"\n")
    r = sbx.exec(["bash", "-c", "chmod +x run.sh && ./run.sh arg"])
    assert (r.status, r.stdout) == ("ok", "ran arg\n"), r


def test_pytest_runs_in_the_sandbox(sbx):
    sbx.write_file("test_x.py", "def test_ok():\n    assert 1 + 1 == 2\n\ndef test_bad():\n    assert 1 == 2\n")
    r = sbx.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"], timeout_s=20)
    assert r.status == "error" and r.exit_code == 1 and "1 failed, 1 passed" in r.stdout, r


def test_stdin_text_and_bytes(sbx):
    assert sbx.exec(["cat"], stdin="héllo").stdout == "héllo"
    assert sbx.exec(["wc", "-c"], stdin=b"\x00" * 100_000).stdout.strip() == "100000"


def test_identity_and_environment(sbx):
    r = sbx.exec(["bash", "-c", "id -u; id -g; pwd; echo $HOME; echo $PYTHONPATH; uname -n"])
    assert r.stdout.split() == ["65534", "65534", "/app", "/app", "/opt/harnessrl/site", "sandbox"], r


def test_no_network(sbx):
    r = run(sbx, "import socket\ns=socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 53))")
    assert r.status == "error" and "Network is unreachable" in r.stderr


def test_wall_time_limit_kills(sbx):
    t0 = time.monotonic()
    r = run(sbx, "import time\ntime.sleep(30)", timeout_s=1)
    assert r.status == "timeout" and r.exit_code is None and time.monotonic() - t0 < 4
    assert r.combined_output().endswith("[killed: time limit]")


def test_cpu_limit(sbx):
    r = run(sbx, "while True: pass", timeout_s=20)
    assert r.status == "cpu_limit" and r.exit_code == -24  # SIGXCPU after cpu_s=2
    assert r.wall_s > 1.9  # one thread needs at least cpu_s of wall time


def test_memory_limit(sbx):
    r = run(sbx, "x = bytearray(600 * 1024 * 1024)")
    assert r.status == "memory_limit" and "MemoryError" in r.stderr


def test_process_limit_stops_a_fork_bomb(sbx):
    r = run(sbx, "import os\nn=0\ntry:\n    while True:\n        if os.fork()==0:\n            import time; time.sleep(5); os._exit(0)\n        n+=1\nexcept OSError:\n    print('stopped', n)")
    assert r.status == "ok", r
    assert r.stdout.split()[0] == "stopped" and int(r.stdout.split()[1]) < 32  # max_procs=32 held


def test_work_dir_quota(sbx):
    r = sbx.exec(["bash", "-c", "for i in 1 2 3 4 5; do dd if=/dev/zero of=f$i bs=1M count=4 2>/dev/null || exit 1; done"])
    assert r.status == "disk_limit", r
    du = sbx.exec(["du", "-sm", "/app"]).stdout.split()[0]
    assert int(du) <= 16
    with pytest.raises(OSError):
        sbx.write_file("more.bin", b"x" * (2 << 20))


def test_output_is_capped_keeping_head_and_tail(sbx):
    r = run(sbx, "print('A' * 50000 + 'Z' * 50000)")
    assert r.status == "ok" and r.truncated and len(r.stdout) == 2000
    assert r.stdout.startswith("AAAA") and r.stdout.rstrip().endswith("ZZZZ") and "[output cut]" in r.stdout


def test_unknown_command_is_an_error_not_a_crash(sbx):
    r = sbx.exec(["no-such-command", "x"])
    assert (r.status, r.exit_code) == ("error", 127) and "no-such-command" in r.stderr


def test_path_checks(sbx):
    with pytest.raises(SandboxPathError, match="escapes"):
        sbx.write_file("../evil.py", "x")
    with pytest.raises(SandboxPathError, match="relative"):
        sbx.read_file("/etc/passwd")
    with pytest.raises(FileNotFoundError):
        sbx.read_file("missing.txt")


def test_bad_arguments(sbx):
    with pytest.raises(ValueError, match="argv"):
        sbx.exec([])
    with pytest.raises(ValueError, match="timeout_s"):
        sbx.exec(["true"], timeout_s=0)


def test_cleanup_is_idempotent_and_final(sbx):
    sbx.cleanup()
    sbx.cleanup()
    with pytest.raises(SandboxError, match="cleaned up"):
        sbx.exec(["true"])


def test_combined_output_notes_the_limit():
    r = ExecResult(status="output_limit", exit_code=None, stdout="a", stderr="b", wall_s=0.1, truncated=True)
    assert r.combined_output() == "a\nb\n[killed: output limit]"
    assert ExecResult(status="ok", exit_code=0, stdout="", stderr="", wall_s=0.0).combined_output() == ""


def test_config_validation():
    with pytest.raises(ValueError, match="output_kill_bytes"):
        SandboxConfig(output_bytes=4096, output_kill_bytes=1000)
    with pytest.raises(ValueError, match="docker_image"):
        SandboxConfig(backend="bwrap", docker_image="x:y")
    with pytest.raises(ValueError, match="backend"):
        SandboxConfig(backend="firecracker")
    with pytest.raises(ValueError, match="workdir_mb"):
        SandboxConfig(workdir_mb=0)


def test_the_shell_tools_terminal_tasks_use_are_there(sbx):
    tools = "awk sed grep find sort uniq tr cut head tail wc tar gzip sha256sum md5sum xargs diff python3 bash"
    res = sbx.exec(["bash", "-c", f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done; "
                                  "printf 'b 2\\na 1\\n' | sort | awk '{s += $2} END {print s}'"], timeout_s=10)
    assert (res.status, res.stdout) == ("ok", "3\n")
