"""The episode's browser in a process that has not imported the task suites: the browser layer
(:mod:`tasks.environments.browser`) no longer imports them itself, so the episode loop
(:meth:`tasks.rollout.harness.EpisodeEnv.browser_session`) must, or a MiniWoB task finds no
browser for its verifier kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tasks.config import SuiteConfig
from tasks.records.suites.base import load_suite
from tests.facilities import require_chromium

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, sys
from tasks.config import SandboxConfig
from tasks.rollout.harness import EpisodeEnv
before = sorted(m for m in sys.modules if m.startswith("tasks.records.suites"))
env = EpisodeEnv(json.loads(sys.stdin.read()), SandboxConfig(), seed=0)
try:
    first = env.browser_session().observe().splitlines()[0]
finally:
    env.close()
print(json.dumps({"before": before, "first": first}))
"""


def test_an_episode_opens_a_miniwob_browser_in_a_fresh_process():
    require_chromium()
    task = load_suite(SuiteConfig(source="miniwob", name="click-button", size=1, seed=11))[0]
    row = task.to_row("test")
    out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(row), capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == []  # nothing had registered the browser before the episode asked for it
    assert got["first"] == f"Task: {task.instruction}"
