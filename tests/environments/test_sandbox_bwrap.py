"""bubblewrap specifics: the sandbox is a pid namespace holding only its exec server between
execs, runs as the host's uid 65534 when started by root, and leaves nothing on the host."""

from __future__ import annotations

import os
import tempfile

import pytest

from tasks.config import SandboxConfig
from tasks.environments.sandbox import SandboxError, make_sandbox
from tests.facilities import bwrap_missing, require


@pytest.fixture
def sbx():
    require("bubblewrap", bwrap_missing())
    s = make_sandbox(SandboxConfig(wall_s=3, cpu_s=2, memory_mb=256, workdir_mb=8, tmp_mb=8))
    yield s
    s.cleanup()


def test_only_the_server_lives_between_execs_and_nothing_after_cleanup(sbx):
    pids = sbx.host_pids()
    assert len(pids) == 1
    assert sbx.exec(["bash", "-c", "sleep 300 & sleep 300 & echo started"]).detail == "2 leftover process(es) killed"
    assert sbx.host_pids() == pids
    sbx.cleanup()
    assert sbx.host_pids() == [] and not os.path.exists(f"/proc/{pids[0]}")


@pytest.mark.skipif(os.geteuid() != 0, reason="host uid mapping is only changed when the host process is root")
def test_runs_as_host_nobody_when_started_by_root(sbx):
    (pid,) = sbx.host_pids()
    with open(f"/proc/{pid}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert uids == ["65534"] * 4


def test_no_host_files(sbx):
    before = set(os.listdir(tempfile.gettempdir()))
    sbx.write_file("x.bin", b"x" * (4 << 20))
    assert sbx.exec(["bash", "-c", "dd if=/dev/zero of=/tmp/y bs=1M count=4 2>/dev/null"]).status == "ok"
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - before if "harnessrl" in n} == set()


def test_dead_server_is_reported_and_the_sandbox_refuses_further_use(sbx):
    (pid,) = sbx.host_pids()
    os.kill(pid, 9)  # from the host: the only way to kill the sandbox's pid 1
    with pytest.raises(SandboxError, match="exec server"):
        sbx.exec(["true"])
    with pytest.raises(SandboxError, match="dead"):
        sbx.read_file("x")
