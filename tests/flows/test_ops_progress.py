"""tasks/progress.py: no bar off a terminal, log lines through the module logger outside a Prefect
run (and a final line with the count), a bar when stderr is a terminal."""

from __future__ import annotations

import io
import logging

import pytest

from tasks import progress as P


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_logs_outside_a_run_and_no_bar_off_a_tty(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert P.bar_enabled() is False
    assert P.run_logger() is P._log
    keep = _Keep()
    P._log.addHandler(keep)
    old_level = P._log.level
    P._log.setLevel(logging.INFO)  # setLevel also clears the logger's enabled-for cache
    monkeypatch.setattr(P._log, "disabled", False)  # logging.config (Prefect's) may have disabled it
    try:
        with P.progress("rollout episodes", 6, "episodes", log_every_s=0.0) as advance:
            for _ in range(3):
                advance(2)
    finally:
        P._log.removeHandler(keep)
        P._log.setLevel(old_level)
    msgs = [r.getMessage() for r in keep.records]
    assert msgs[0].startswith("rollout episodes: 2/6 episodes (0 s, ETA ")
    assert msgs[1].startswith("rollout episodes: 4/6 episodes (0 s, ETA ")
    assert msgs[-1].startswith("rollout episodes: 6/6 episodes in ")
    assert len(msgs) == 3  # no periodic line once the work is done; one final line


def test_a_line_every_log_every_s_while_nothing_is_done(monkeypatch):
    """A long unit (one vLLM batch) still gives a line per period: the count so far and its ETA."""
    import time

    monkeypatch.setattr("sys.stderr", io.StringIO())
    keep = _Keep()
    P._log.addHandler(keep)
    old_level = P._log.level
    P._log.setLevel(logging.INFO)
    monkeypatch.setattr(P._log, "disabled", False)
    try:
        with P.progress("rollout", 4, "turn slots", log_every_s=0.2) as advance:
            time.sleep(0.7)  # nothing done: heartbeat lines, about 3
            before = len(keep.records)
            advance(1)
            time.sleep(0.5)  # more, with the count and an ETA
    finally:
        P._log.removeHandler(keep)
        P._log.setLevel(old_level)
    msgs = [r.getMessage() for r in keep.records]
    assert before >= 2 and all(m.startswith("rollout: 0/4 turn slots (") and m.endswith(", ETA ?)")
                               for m in msgs[:before]), msgs
    after = msgs[before:-1]
    assert after and all(m.startswith("rollout: 1/4 turn slots (") and "ETA ?" not in m for m in after), msgs
    assert msgs[-1].startswith("rollout: 1/4 turn slots in ")


def test_bar_on_a_tty_and_env_switch(monkeypatch):
    class TTY(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", TTY())
    assert P.bar_enabled() is True
    monkeypatch.setenv("HARNESSRL_PROGRESS", "0")
    assert P.bar_enabled() is False


def test_negative_total_is_refused():
    with pytest.raises(ValueError, match="total=-1"):
        with P.progress("x", -1):
            pass


def test_the_bar_draws_on_the_console_prefect_logs_with(monkeypatch):
    """Log lines never share a line with the bar: the bar is drawn on the root logger's
    PrefectConsoleHandler console (rich prints that console's lines above a live bar), not on a
    second console writing to the same stream."""
    import rich.progress
    from prefect.logging.handlers import PrefectConsoleHandler

    class TTY(io.StringIO):
        def isatty(self):
            return True

    handler = PrefectConsoleHandler(stream=TTY())  # a terminal: the bar is rendered with its styles
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler(), handler])
    assert P.log_console() is handler.console
    seen = {}

    class Spy(rich.progress.Progress):
        def __init__(self, *a, **k):
            seen["console"] = k.get("console")
            super().__init__(*a, **k)

    monkeypatch.setattr(rich.progress, "Progress", Spy)
    monkeypatch.setattr(P, "bar_enabled", lambda: True)
    with P.progress("steps", 2, "steps") as advance:
        advance(1)
        advance(1)
    assert seen["console"] is handler.console
    assert "steps" in handler.stream.getvalue()  # drawn: every style it uses resolved on Prefect's console
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    assert P.log_console() is None
