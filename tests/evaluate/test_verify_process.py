"""``harnessrl verify`` as a process (issue 20, item 4): it never aborts at exit, and its import path
leaves out the trainer and rollout engine (torch and their native thread pools)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from tests.evaluate.test_stage import _cfg, _run

    tmp = tmp_path_factory.mktemp("verify-proc")
    _run(tmp, _cfg(infra_retries=1, bootstrap_resamples=200))
    return tmp / "run"


def _verify(run_dir: Path, code: str = "") -> subprocess.CompletedProcess:
    prog = ("import sys\nsys.argv = ['harnessrl', 'verify', sys.argv[1]]\nfrom flows.cli import app\n"
            f"try:\n    app()\nfinally:\n    {code or 'pass'}\n")
    return subprocess.run([sys.executable, "-c", prog, str(run_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_verify_imports_no_torch(run_dir):
    r = _verify(run_dir, "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'vllm', 'prefect') "
                         "if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert "verified:" in r.stdout and "HEAVY []" in r.stdout, r.stdout


@pytest.mark.slow
def test_verify_exits_0_thirty_times_in_a_row(run_dir):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:  # 30 separate processes, three at a time (both cores busy)
        codes = list(pool.map(lambda _: _verify(run_dir), range(30)))
    bad = [(c.returncode, c.stderr[-300:]) for c in codes if c.returncode != 0 or "terminate called" in c.stderr]
    assert [c.returncode for c in codes] == [0] * 30, bad
