"""Progress of long loops (rollout shards and episodes, train steps, analyze parts): a
rich progress bar on a terminal, drawn on Prefect's console so log lines print above it, plus log
lines through Prefect's run logger (inside a flow or task run) or the ``harnessrl`` module logger
(outside one), so a run's progress shows in the Prefect UI too.

The bar is drawn only when stderr is a TTY and ``HARNESSRL_PROGRESS`` is not ``0``; log lines are
written every ``log_every_s`` seconds whether or not a unit was done meanwhile (and at the end),
never per item, each with an ETA.

A policy engine reports the requests of one ``generate`` call as they complete with
:func:`requests_done`; whoever called ``generate`` inside :func:`on_requests_done` hears of them
(the harness engine turns them into turn slots), so one long batch moves the bar too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

_log = logging.getLogger("harnessrl.progress")
_REQUESTS: ContextVar[Callable[[int], None] | None] = ContextVar("harnessrl_requests_done", default=None)


@contextmanager
def on_requests_done(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, :func:`requests_done` calls in this thread (or context) call
    ``callback(n)``; the previous listener, if any, is restored after."""
    token = _REQUESTS.set(callback)
    try:
        yield
    finally:
        _REQUESTS.reset(token)


def requests_done(n: int) -> None:
    """Tell the listener of :func:`on_requests_done` (if any) that ``n`` more requests of the
    current ``generate`` call have completed. Engines call it as completions arrive."""
    if n:
        callback = _REQUESTS.get()
        if callback is not None:
            callback(n)


def run_logger() -> logging.Logger | logging.LoggerAdapter[Any]:
    """Prefect's ``get_run_logger()`` when called inside a flow or task run, else the module logger."""
    try:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError

        try:
            return get_run_logger()
        except MissingContextError:
            return _log
    except ImportError:  # pragma: no cover - prefect is a dependency
        return _log


def log_console() -> Any:
    """The rich console Prefect's console log handler prints with (the root logger's
    ``PrefectConsoleHandler``), or None when there is none. A bar drawn on that console keeps log
    lines above it: rich's live display owns the console's output, whereas a second console on the
    same stream would glue log lines onto the bar."""
    try:
        from prefect.logging.handlers import PrefectConsoleHandler
    except ImportError:  # pragma: no cover - prefect is a dependency
        return None
    for h in logging.getLogger().handlers:
        if isinstance(h, PrefectConsoleHandler):
            return h.console
    return None


def bar_enabled() -> bool:
    """True when a bar should be drawn: stderr is a TTY and ``HARNESSRL_PROGRESS`` is not ``0``."""
    return os.environ.get("HARNESSRL_PROGRESS", "1") != "0" and sys.stderr.isatty()


def eta(done: int, total: int, elapsed_s: float) -> str:
    """``"ETA 3m05s"`` from the rate so far (``done`` of ``total`` in ``elapsed_s``), or
    ``"ETA ?"`` before anything is done."""
    if done <= 0 or elapsed_s <= 0:
        return "ETA ?"
    left = max(total - done, 0) * elapsed_s / done
    m, s = divmod(int(round(left)), 60)
    h, m = divmod(m, 60)
    return f"ETA {h}h{m:02d}m" if h else (f"ETA {m}m{s:02d}s" if m else f"ETA {s}s")


@contextmanager
def progress(desc: str, total: int, unit: str = "items", log_every_s: float = 10.0
             ) -> Iterator[Callable[[int], None]]:
    """Track ``total`` units of work named ``desc``; yields ``advance(n=1)``.

    Args:
        desc: what is being done, e.g. ``"rollout shards"``.
        total: the number of units (>= 0).
        unit: the units' name in log lines (``shards``, ``steps``, ``episodes``).
        log_every_s: seconds between log lines (a line is always written at the end); a background
            thread writes one when that long passed without a unit done.

    ``advance`` may be called from several threads (the thread runner's shards).

    Raises:
        ValueError: ``total`` < 0.
    """
    if total < 0:
        raise ValueError(f"progress {desc!r}: total={total} must be >= 0")
    logger = run_logger()
    done = [0]
    lock = threading.Lock()
    t0 = last = time.monotonic()
    bar = None
    task_id = None
    console = None
    if bar_enabled():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        console = log_console()  # Prefect's, or None: rich's own
        if console is not None:
            # Prefect's console has its own theme without rich's defaults (inherit=False): add the
            # bar's styles while the bar is drawn
            from rich.default_styles import DEFAULT_STYLES
            from rich.theme import Theme

            console.push_theme(Theme({k: v for k, v in DEFAULT_STYLES.items()
                                      if k.startswith(("bar.", "progress."))}))
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TimeRemainingColumn(), transient=True, console=console)
        bar.start()
        task_id = bar.add_task(desc, total=total)

    def note(force: bool) -> None:  # under the lock
        nonlocal last
        now = time.monotonic()
        if (force or now - last >= log_every_s) and done[0] < total:
            last = now
            logger.info("%s: %d/%d %s (%.0f s, %s)", desc, done[0], total, unit, now - t0,
                        eta(done[0], total, now - t0))

    def advance(n: int = 1) -> None:
        with lock:
            done[0] += n
            if bar is not None:
                bar.update(task_id, advance=n)
            note(False)

    stop = threading.Event()

    def heartbeat() -> None:  # a line at least every log_every_s, whether or not a unit was done
        while not stop.wait(max(0.05, log_every_s - (time.monotonic() - last))):
            with lock:
                if time.monotonic() - last >= log_every_s:
                    note(True)

    beat = threading.Thread(target=heartbeat, name=f"progress-{desc}", daemon=True)
    if log_every_s > 0:  # 0: a line per advance already
        beat.start()
    try:
        yield advance
    finally:
        stop.set()
        if beat.is_alive():
            beat.join()
        if bar is not None:
            bar.stop()
            if console is not None:
                console.pop_theme()
        logger.info("%s: %d/%d %s in %.1f s", desc, done[0], total, unit, time.monotonic() - t0)
