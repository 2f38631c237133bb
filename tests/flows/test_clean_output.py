"""A normal run prints no traceback, ERROR line or warning from start to finish, the temporary
Prefect server's shutdown included (issue 41), and names its flow runs after the config."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.naming import run_label
from tasks.config import load_config
from tests.flows.test_ops_faults import tiny_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def _run_cli(cfg_path: Path, rd: Path, home: Path) -> tuple[int, str]:
    """``harnessrl run`` as a user runs it: its own process, no PREFECT_API_URL (so it starts and
    stops Prefect's temporary server), a fresh Prefect home. Returns (exit status, output)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), COLUMNS="200", HARNESSRL_PROGRESS="0")
    log = rd.parent / "cli.log"
    with open(log, "w") as f:  # a file, not a pipe: the server child could hold a pipe open
        p = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "-c", str(cfg_path), "--run-dir", str(rd)],
                             cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=540)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    return rc, log.read_text()


def test_a_normal_run_prints_no_traceback_error_or_warning(tiny_model_dir, tmp_path):
    cfg_path = tmp_path / "clean.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config(tiny_model_dir, name="clean")))
    rc, out = _run_cli(cfg_path, tmp_path / "run", tmp_path / "prefect-home")
    assert rc == 0, out[-3000:]
    assert "Starting temporary server" in out and "Stopping temporary server" in out  # the user's case
    lines = out.splitlines()
    # the temporary server stops after the last line the run prints: its shutdown is in the output
    assert "Stopping temporary server" in lines[-1], lines[-3:]
    bad = [ln for ln in lines if "Traceback" in ln or "ERROR" in ln or "warning" in ln.lower()]
    assert not bad, "\n".join(bad[:20])
    label = run_label(load_config(cfg_path))
    assert f"Beginning flow run '{label}'" in out and f"Beginning subflow run 'freeze · {label}'" in out
    assert "sealed evaluation (test split)" in out
    # the infra errors per stage, counted from the run's artifacts (none in a normal run)
    infra = [ln for ln in lines if ln.startswith("infra errors: ")]
    assert len(infra) == 1 and infra[0].startswith("infra errors: rollout 0 of "), infra
    assert ", evaluate 0 of " in infra[0]
    assert "## Infra errors" in (tmp_path / "run" / "analyze" / "report.md").read_text()


BURST = """
import sys
from pathlib import Path

from flows.process_setup import prepare_environment, settled_server

prepare_environment(Path(sys.argv[1]))  # as the CLI does, before Prefect is imported
from prefect import flow, task, get_run_logger


@task
def step(i):
    get_run_logger().info("step %d", i)
    return i


@flow(name="burst")
def burst():
    return sum(step(i) for i in range(150))


with settled_server():
    print("sum", burst())
"""


def test_the_temporary_server_stops_quietly_after_a_burst_of_task_runs(tmp_path):
    # 150 task runs end together: at exit the server is still recording their states (one
    # transaction per event); stopped then, it printed "ERROR ... Error flushing" or
    # "Exception during reset" with a CancelledError traceback
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO))
    log = tmp_path / "burst.log"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-c", BURST, str(tmp_path)], cwd=REPO, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=400)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    out = log.read_text()
    assert rc == 0 and "sum 11175" in out, out[-3000:]
    assert out.count("Finished in state Completed()") == 151 and "Stopping temporary server" in out
    bad = [ln for ln in out.splitlines() if "Traceback" in ln or "ERROR" in ln or "warning" in ln.lower()]
    assert not bad, "\n".join(bad[:20])
