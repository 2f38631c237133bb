"""What a command sets up in its process before and around a run: the environment Prefect reads
at import, quiet libraries, one-line errors instead of tracebacks for errors that say it all, and
the wait for Prefect's temporary server to record everything at the end."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator


def prepare_environment(run_root: Path) -> None:
    """Settings that must exist before Prefect is imported: a Prefect home inside the run root
    (its SQLite DB stays out of the user's home), no telemetry, our loggers in the Prefect logs,
    quiet transformers."""
    os.environ.setdefault("PREFECT_HOME", str((run_root / ".prefect-home").resolve()))
    # Prefect creates its home without parents: with --run-dir elsewhere the run root may not exist yet
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # 20 s is short on a busy host
    # a temporary server stores events every second, not every 5: the run's end waits for them (flows/server.py)
    os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "1")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "harnessrl")
    # our loggers also log from worker threads outside any flow run (the online sampler's thread):
    # those lines go to the console only, without Prefect's per-line "no flow run id" warning
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextlib.contextmanager
def settled_server() -> Iterator[None]:
    """Run the body, then (also when it raised an exception; not after Ctrl-C) wait until
    Prefect's temporary server, if this process started one, has recorded everything the run
    sent (:func:`flows.server.settle_temporary_server`): stopped at exit while it still writes,
    it prints an ERROR line and a CancelledError traceback."""
    import datetime as dt

    from flows.server import settle_temporary_server

    since = dt.datetime.now(dt.timezone.utc)
    try:
        yield
    except Exception:
        settle_temporary_server(since)
        raise
    settle_temporary_server(since)


def quiet_libraries() -> None:
    """Silence what the libraries print that is not ours: peft's deprecation warning, transformers'
    progress bars and info lines, great_expectations' logs; ours at INFO."""
    import logging
    import warnings

    # peft 0.21 reads `model.is_gradient_checkpointing` when it wraps a model (peft_model.py), which
    # transformers 5 deprecates in favour of `is_activation_checkpointing`: their cause, not ours.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:
        pass
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    logging.getLogger("harnessrl").setLevel(logging.INFO)


class NoTraceback:
    """A logging filter that keeps a record's message but drops its traceback when the exception
    (or one it was raised from) is one of ``kinds``: errors whose one-line message says it all."""

    def __init__(self, kinds: tuple[type[BaseException], ...]) -> None:
        self.kinds = kinds

    def filter(self, record: Any) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        seen = 0
        while exc is not None and seen < 10:
            if isinstance(exc, self.kinds):
                record.exc_info, record.exc_text = None, None
                break
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return True


def one_line_for(*kinds: type[BaseException]) -> None:
    """Prefect's engines log a failed task or flow run with its traceback; for ``kinds`` the
    run ends in one red line instead (the handlers of every configured logger get the filter)."""
    import logging

    f = NoTraceback(kinds)
    loggers = [logging.getLogger()] + [lg for name, lg in logging.root.manager.loggerDict.items()
                                       if name.startswith("prefect") and isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if not any(isinstance(x, NoTraceback) for x in h.filters):
                h.addFilter(f)
