"""No descriptor limit in the sandboxes (issue 53, part 1): a bwrap sandbox started when the
process already holds more than 1,100 descriptors gets pipes numbered above 1023, where
``select(2)`` refuses them ("filedescriptor out of range in select()"), and still runs an
episode's tool call; and the rollout makes room for its planned sandboxes in RLIMIT_NOFILE, or
refuses in one line."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.config import SandboxConfig
from tasks.harnesses.tools import IMPLS
from tasks.rollout.harness import EpisodeEnv
from tasks.environments.sandbox.limits import (FD_HEADROOM, FDS_PER_SANDBOX, HostLimitError, ensure_descriptors,
                                          episode_sandboxes, open_descriptors, planned_sandboxes)
from tests.facilities import bwrap_missing, require

ROOT = Path(__file__).resolve().parents[2]
HELD = 1100


@pytest.fixture
def many_descriptors():
    """Hold :data:`HELD` more descriptors (``/dev/null``), the soft RLIMIT_NOFILE raised for them
    when needed and restored after; yields the list of descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = open_descriptors() + HELD + 256
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard RLIMIT_NOFILE is {hard}, below the {want} descriptors this test holds")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fds: list[int] = []
    try:
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(HELD)]
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_sandbox_above_descriptor_1023_runs_an_episode_tool_call(many_descriptors):
    require("bubblewrap", bwrap_missing())
    assert min(many_descriptors) < 1024 < max(many_descriptors)  # every free number below 1024 is taken
    task = {"task_id": "t-fds", "workspace": '{"files": {"data.txt": "3 4\\n"}, "setup": ["cp data.txt copy.txt"]}'}
    env = EpisodeEnv(task, SandboxConfig(wall_s=10, cpu_s=5), seed=0)
    try:
        sbx = env.sandbox()  # bwrap starts, pings its server, writes the workspace, runs the set-up
        fds = [sbx._proc.stdin.fileno(), sbx._proc.stdout.fileno()]  # type: ignore[attr-defined]
        assert min(fds) > 1023, fds  # the case select() cannot take
        # the react harnesses' python tool: write main.py, run it in the sandbox
        out = IMPLS["python"].run(env, {"code": "a, b = map(int, open('copy.txt').read().split())\nprint(a * b)"}, 10.0)
        assert out.status == "ok" and out.text.strip() == "12", out
        assert sbx.read_file("copy.txt") == b"3 4\n"
    finally:
        env.close()


def test_ensure_descriptors_raises_the_soft_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < open_descriptors() + 3 * 200 + FD_HEADROOM:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) leaves no room for this test")
    low = open_descriptors() + FD_HEADROOM + 10
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert ensure_descriptors(1, "bwrap", "t") == low  # 1 sandbox fits: left alone
        assert ensure_descriptors(200, "bwrap", "t") == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_plan_the_hard_limit_cannot_hold_is_refused_in_one_line():
    # in a child: lowering the hard limit cannot be undone
    code = textwrap.dedent("""
        import resource
        from tasks.environments.sandbox.limits import HostLimitError, ensure_descriptors, open_descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        now = open_descriptors()
        try:
            ensure_descriptors(1000, "bwrap", "rollout")
        except HostLimitError as e:
            print(now, e)
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    now, _, msg = res.stdout.strip().partition(" ")
    needed = int(now) + 1000 * FDS_PER_SANDBOX["bwrap"] + FD_HEADROOM
    assert "\n" not in msg and msg.startswith("rollout: 1000 bwrap sandboxes may be open at once")
    assert f"needs {needed} descriptors" in msg and "hard RLIMIT_NOFILE is 1024" in msg


def test_episode_sandboxes_counts_the_episodes_that_open_one():
    class Tool:
        def __init__(self, impl: str):
            self.impl_name = impl

    class Spec:
        def __init__(self, *impls: str):
            self.tools = [Tool(i) for i in impls]

    assert IMPLS["python"].needs == "sandbox" and IMPLS["calculate"].needs != "sandbox"
    tasks = [{"environment": "answer"}, {"environment": "workspace"}, {"environment": "answer"}]
    assert episode_sandboxes(Spec("python"), tasks, 4) == 12  # a sandbox tool: every episode
    assert episode_sandboxes(Spec("calculate"), tasks, 4) == 4  # only the workspace task's
    assert episode_sandboxes(Spec(), tasks[:1], 4) == 0


def test_planned_sandboxes_per_runner():
    assert planned_sandboxes([5, 9, 7], "serial", 2) == 9
    assert planned_sandboxes([5, 9, 7], "thread", 2) == 16
    assert planned_sandboxes([5, 9, 7], "thread", 8) == 21
    assert planned_sandboxes([5, 9, 7], "dask", 2) == 0 and planned_sandboxes([], "serial", 1) == 0
    with pytest.raises(ValueError, match="task_runner='x'"):
        planned_sandboxes([1], "x", 1)
    with pytest.raises(ValueError, match="backend='podman'"):
        ensure_descriptors(1, "podman", "t")


def test_a_sandbox_holds_its_counted_descriptors_and_no_more_across_calls():
    """What the plan counts per sandbox (FDS_PER_SANDBOX) is what one holds; its waits hold none
    per call (no selector leaked per call), and cleanup gives every one back."""
    require("bubblewrap", bwrap_missing())
    from tasks.environments.sandbox import make_sandbox

    before = open_descriptors()
    sbx = make_sandbox(SandboxConfig(wall_s=5, cpu_s=2))
    try:
        assert open_descriptors() == before + FDS_PER_SANDBOX["bwrap"]
        for i in range(20):
            assert sbx.exec(["echo", str(i)]).stdout == f"{i}\n"
        assert open_descriptors() == before + FDS_PER_SANDBOX["bwrap"]
    finally:
        sbx.cleanup()
    assert open_descriptors() == before


@pytest.mark.parametrize(("rollout", "planned"), [({"task_runner": "serial"}, 400),
                                                   ({"task_runner": "thread", "workers": 2, "shard_size": 160}, 320)])
def test_run_records_refuses_a_plan_the_hard_limit_cannot_hold_before_any_episode(rollout, planned):
    """100 react-python records x 4 samples: every episode has a sandbox tool. Serial, one shard:
    400 sandboxes open at once; thread with 2 workers and shards of 160, 160 and 80 episodes: 320
    (one shard alone, 160, would fit). Under a hard limit of 1024 descriptors neither plan fits
    (3 each + 256 spare), and nothing is sampled: the policy is never touched."""
    code = textwrap.dedent(f"""
        import json, resource
        from tasks.config import RunConfig
        from tasks.harnesses.spec import HarnessSpec
        from tasks.records.freeze import freeze_tables
        from tasks.rollout.runner import run_records
        from tasks.environments.sandbox.limits import HostLimitError

        class Untouched:
            policy_id = "p"
            def __getattr__(self, name):
                raise AssertionError("the policy was used: " + name)

        cfg = RunConfig.model_validate({{"name": "fds", "seed": 0, "harnesses": ["react-python"],
                                         "suites": [{{"name": "basic_arithmetic", "size": 100, "seed": 0}}],
                                         "rollout": {rollout!r}}})
        tasks, harnesses, records = freeze_tables(cfg)
        specs = {{h["harness_id"]: HarnessSpec.model_validate(json.loads(h["spec_json"])) for h in harnesses}}
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        try:
            run_records(Untouched(), cfg, specs, {{t["task_id"]: t for t in tasks}}, records, 4, 0, "rollout")
        except HostLimitError as e:
            print(e)
    """)
    # its own process group: a run that was not refused starts Prefect's temporary server, which
    # a timeout must not leave behind
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"run_records was not refused: the {planned} planned sandboxes went on to run")
    assert proc.returncode == 0, err[-3000:]
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert res.stdout.startswith(f"rollout: {planned} bwrap sandboxes may be open at once"), res.stdout
    assert "hard RLIMIT_NOFILE is 1024" in res.stdout
