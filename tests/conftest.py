"""Shared fixtures: the tiny model (built once per session) and one Prefect test harness."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "harnessrl")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-128, vocab-1024 Llama with a BPE tokenizer trained here (~0.5M params)."""
    import transformers

    from tasks.rollout.models import build_tiny_model

    transformers.utils.logging.disable_progress_bar()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    """One ephemeral Prefect API (SQLite) for every test that runs flows (~12 s to start)."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):  # 30 s is not enough on 2 busy cores
        # Subprocesses (the CLI, benchmark smokes) inherit the API too: without one, each process
        # that runs a flow starts its own temporary server (~10 s on 2 cores).
        from prefect.settings import PREFECT_API_URL

        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
        yield
        os.environ.pop("PREFECT_API_URL", None)
        # The harness drains Prefect's log and event services with no timeout. At the end of the
        # whole suite (several Prefect servers in this process) a service whose event loop is gone
        # blocked that drain forever. Drain them first with a bound: each instance is stopped and
        # removed at once, so the harness's own drain finds none left to wait for.
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for service in (APILogWorker, EventsWorker):
            service.drain_all(timeout=10)

_EXIT_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with pytest's exit status without running the interpreter's exit handlers. Prefect
    registers, per log or event service it started, an unbounded drain at interpreter exit; in
    this process (several Prefect servers one after another) one of them waited forever for an
    event loop that was gone, after every test had run and the summary was printed (seen in a
    fresh-clone .ci/run). Every report is written by now."""
    if "status" in _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS["status"])
