"""The adversarial battery (issue 20): every attempt of :mod:`tests.records.grader_attacks` against a
real task of every verifier kind, on both sandbox backends. A cell passes when the wrong answer with
the attempt planted scores 0.0, the right answer with the same attempt scores 1.0, and no planted
Python ran while grading. One test per (backend, kind): 22 attempts x 2 fresh sandboxes each."""

from __future__ import annotations

import pytest

from tests.facilities import bwrap_missing, docker_missing, require
from tests.records.grader_attacks import ATTEMPTS, KINDS, KINDS_NO_SANDBOX, run_cell
from tests.records.tb_helpers import require_sandbox


def _require(backend: str) -> None:
    require_sandbox()
    if backend == "docker":
        require("docker sandbox", docker_missing())
    else:
        require("bubblewrap", bwrap_missing())


#: sandboxes graded at once: a cell's time is mostly the sandbox's start and the verifier's pytest
#: start-up, so several at a time keep both cores busy (each sandbox is isolated: own root, /tmp)
CONCURRENT = 4


def _cells(kind: str, backend: str, attempts=ATTEMPTS) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(a, right) for a in attempts for right in (False, True)]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        got = list(pool.map(lambda job: run_cell(KINDS[kind], job[0], backend, job[1]), jobs))
    bad = []
    for n, a in enumerate(attempts):
        (wrong, ran_w), (right, ran_r) = got[2 * n], got[2 * n + 1]
        if (wrong, right, ran_w or ran_r) != (0.0, 1.0, False):
            bad.append(f"{a.name}: wrong answer {wrong}, right answer {right}, planted code ran: {ran_w or ran_r}")
    return bad


def test_battery_has_at_least_20_attempts_and_every_kind():
    assert len(ATTEMPTS) >= 20 and len({a.name for a in ATTEMPTS}) == len(ATTEMPTS)
    assert set(KINDS) | set(KINDS_NO_SANDBOX) == {"humaneval", "tb1-exercism", "tb1", "harbor", "p6",
                                                  "reasoning-gym", "miniwob"}


def test_exercism_conftest_and_entry_point_plugin_fast():
    """The hole of issue 20 (a conftest next to the copied Exercism test: 54/54 on an untouched stub)
    and the entry-point plugin, on one real task, bwrap only: the quick guard of the battery."""
    _require("bwrap")
    pick = [a for a in ATTEMPTS if a.name in ("conftest in /app", "pytest plugin by entry point (.dist-info in /app)")]
    assert len(pick) == 2
    assert _cells("tb1-exercism", "bwrap", pick) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_battery(kind, backend):
    _require(backend)
    assert _cells(kind, backend) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_battery_miniwob(backend):
    from tests.facilities import require_chromium
    from tests.records.grader_attacks import run_miniwob

    require_chromium()
    _require(backend)
    assert run_miniwob(ATTEMPTS, backend) == []
