"""Clean stops: SIGTERM and SIGINT end a run within seconds, marked Cancelled.

Inside a flow run Prefect's own SIGTERM handler (``capture_sigterm``) raises
``prefect.exceptions.TerminationSignal`` in the main thread; the task and flow engines mark their
runs ``Crashed`` and re-raise, and the outermost one re-sends the signal to the handler that was
there before (with Python's default: the process dies on the spot, its temporary Prefect server
left running). :func:`stop_on_signals` puts a handler of ours there for SIGTERM and SIGINT (a
SIGINT raises the same ``TerminationSignal``), so the unwinding reaches the command, which then:

* writes the running stage's record ``Cancelled`` (:func:`flows.common.call_stage` does it as the
  signal passes; ``harnessrl status`` shows ``cancelled``; its artifacts are untouched, being
  written atomically, and a rerun resumes at that stage);
* sets every flow run and task run of this process that did not finish (the pipeline, the stage's
  subflow and its task run) ``Cancelled`` through the Prefect API (forced over the engines'
  ``Crashed``);
* exits with status 128 + the signal number (143 for SIGTERM, 130 for SIGINT), Prefect's exit
  handlers stopping its temporary server.

``Cancelled``, not ``Crashed``: Prefect's states say ``Crashed`` for a run whose infrastructure
failed and ``Cancelled`` for one a person (or a scheduler acting for one) chose to stop; a signal
that the run catches and answers by stopping cleanly, with its records written, is the second.
A SIGKILL or an out-of-memory kill cannot be answered: those runs stay as the server last saw them.

The main thread runs Python's signal handlers only between bytecodes: a long native call (a
training step, a thread pool's shutdown waiting for its tools) would hold the stop back. So the
signal also wakes a watch thread (``signal.set_wakeup_fd``, written by the C-level handler whatever
the main thread is doing); if the process is still there :data:`GRACE_S` seconds after the
signal, the thread does the same work itself (stage record, Prefect states, temporary server
stopped) and ends the process with ``os._exit``. Engine workers and sandboxes end with their
parent (``tasks.rollout.engines.vllm_worker.exit_with_parent``, bwrap ``--die-with-parent``).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_S = 5.0  # seconds the main thread has to unwind before the watch thread ends the process
API_TIMEOUT_S = 1.5  # per Prefect API call while stopping


class _Registry:
    """What this process is running, for a stop to mark: flow runs, the current stage's task run
    and its record (store URL, stage, the record dict as last written)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new :func:`stop_on_signals` block begins)."""
        self.flow_runs: list[str] = []
        self.task_runs: list[str] = []
        self.stage: tuple[str, str, dict[str, Any]] | None = None
        self.signum: int | None = None
        self.signalled_at: float | None = None
        self.marked = False  # Prefect states already set Cancelled
        self.raised = False  # a stop is unwinding the main thread (later signals add nothing)
        self.cancelled_stage: str | None = None  # the stage whose record a stop wrote Cancelled


REGISTRY = _Registry()


def note_flow_run() -> None:
    """Remember the current flow run (call inside one) so that a stop can mark it Cancelled."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        with REGISTRY.lock:
            if str(ctx.flow_run.id) not in REGISTRY.flow_runs:
                REGISTRY.flow_runs.append(str(ctx.flow_run.id))


def note_task_run() -> None:
    """Remember the current task run (call inside one) so that a stop can mark it Cancelled."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is not None and ctx.task_run is not None:
        with REGISTRY.lock:
            if str(ctx.task_run.id) not in REGISTRY.task_runs:
                REGISTRY.task_runs.append(str(ctx.task_run.id))


def note_stage(url: str | None, stage: str | None = None, record: dict[str, Any] | None = None) -> None:
    """Remember the running stage's record (``url`` of its store, the record dict), or forget it
    (``url`` None) once the stage has written its final record."""
    with REGISTRY.lock:
        REGISTRY.stage = None if url is None else (url, str(stage), dict(record or {}))


def is_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is a stop by signal: Prefect's ``TerminationSignal`` or a ``KeyboardInterrupt``."""
    from prefect.exceptions import TerminationSignal

    return isinstance(exc, (TerminationSignal, KeyboardInterrupt))


def signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(int(signum)).name if signum is not None else "a signal"
    except ValueError:
        return f"signal {signum}"


def cancelled_record(record: dict[str, Any], signum: int | None) -> dict[str, Any]:
    """The stage record ``record`` as a stop leaves it: state ``Cancelled``, finished now, the
    signal as its error."""
    out = dict(record)
    out.update(state="Cancelled", finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(),
               error=f"stopped by {signal_name(signum)}; a rerun resumes here")
    if out.get("started_at"):
        started = _dt.datetime.fromisoformat(out["started_at"])
        out["seconds"] = round((_dt.datetime.now(_dt.timezone.utc) - started).total_seconds(), 3)
    return out


def write_cancelled_stage(signum: int | None) -> str | None:
    """Write the running stage's record as Cancelled (once); returns the stage or None."""
    from flows.status import STATE_DIR
    from schemas import ArtifactStore

    with REGISTRY.lock:
        current = REGISTRY.stage
        REGISTRY.stage = None
    if current is None:
        return None
    url, stage, record = current
    REGISTRY.cancelled_stage = stage
    try:
        ArtifactStore(url).write_json(f"{STATE_DIR}/{stage}.json", cancelled_record(record, signum))  # stage_state_path
    except Exception:  # the record is a convenience: status then says interrupted
        pass
    return stage


def api_url() -> str | None:
    """The Prefect API this process uses: ``PREFECT_API_URL``, else its temporary server's."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value()).rstrip("/")
    server = _temporary_server()
    if server is not None and server.running and server.server_process is not None:
        return server.api_url.rstrip("/")
    return None


def mark_cancelled(signum: int | None, deadline_s: float = 3.0) -> dict[str, str]:
    """Set every noted flow run and task run that is not Completed, Failed or Cancelled to
    ``Cancelled`` (forced over ``Crashed``), within ``deadline_s`` seconds in all (a task run the
    server has not recorded yet is retried until then). Returns ``{run id: state it was in}`` for
    those set. Does nothing without a Prefect API or when already done."""
    import httpx

    with REGISTRY.lock:
        if REGISTRY.marked:
            return {}
        REGISTRY.marked = True
        runs = [("flow_runs", i) for i in REGISTRY.flow_runs] + [("task_runs", i) for i in REGISTRY.task_runs]
    api = api_url()
    if api is None or not runs:
        return {}
    message = f"stopped by {signal_name(signum)} (harnessrl); its artifacts are intact and a rerun resumes"
    state = {"type": "CANCELLED", "name": "Cancelled", "message": message}
    end = time.monotonic() + deadline_s
    done: dict[str, str] = {}
    with httpx.Client(timeout=API_TIMEOUT_S) as client:
        pending = list(reversed(runs))  # innermost first: task run, stage subflow, pipeline
        while pending and time.monotonic() < end:
            kind, run_id = pending.pop(0)
            try:
                r = client.get(f"{api}/{kind}/{run_id}")
                if r.status_code == 404:  # not recorded yet (task runs come through the event stream)
                    pending.append((kind, run_id))
                    time.sleep(0.2)
                    continue
                r.raise_for_status()
                was = ((r.json().get("state") or {}).get("type")) or "NONE"
                if was in ("COMPLETED", "FAILED", "CANCELLED"):
                    continue
                client.post(f"{api}/{kind}/{run_id}/set_state", json={"state": state, "force": True}).raise_for_status()
                done[run_id] = was
            except httpx.HTTPError:
                continue
    return done


def _temporary_server() -> Any:
    """Prefect's temporary server instance of this process, or None (never imports the server
    module, seconds of imports, when no server was started)."""
    module = sys.modules.get("prefect.server.api.server")
    return None if module is None else module.SubprocessASGIServer._instances.get(None)


def stop_temporary_server(wait_s: float = 2.0) -> None:
    """Stop this process's temporary Prefect server, if it started one (SIGTERM, then SIGKILL
    after ``wait_s``)."""
    server = _temporary_server()
    proc = getattr(server, "server_process", None)
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=wait_s)
    except Exception:
        proc.kill()


class _Guard:
    """The handlers and the watch thread of one :func:`stop_on_signals` block."""

    def __init__(self, what: str, grace_s: float):
        import prefect.exceptions  # noqa: F401  imported now: a handler must not spend seconds importing it

        self.what, self.grace_s = what, grace_s
        self.previous: dict[int, Any] = {}
        self.previous_fd = -1
        self.rsock, self.wsock = socket.socketpair()
        self.wsock.setblocking(False)
        self.main_finished = False
        self.exiting = False  # the interpreter's exit has begun (an exit handler of ours ran)

    def handler(self, signum: int, frame: Any) -> None:
        from prefect.exceptions import TerminationSignal

        with REGISTRY.lock:
            if REGISTRY.signum is None:
                REGISTRY.signum, REGISTRY.signalled_at = signum, time.monotonic()
        current = sys.exc_info()[1]
        if REGISTRY.raised or (current is not None and is_stop(current)):
            return  # a stop already unwinds (Prefect re-sends the signal from its handler): nothing to add
        REGISTRY.raised = True
        raise TerminationSignal(signal=signum)

    def install(self) -> None:
        with REGISTRY.lock:
            REGISTRY.reset()
        for s in STOP_SIGNALS:
            self.previous[s] = signal.signal(s, self.handler)
        self.previous_fd = signal.set_wakeup_fd(self.wsock.fileno(), warn_on_full_buffer=False)
        atexit.register(self._exiting)  # registered last, so run first: before Prefect stops its server
        threading.Thread(target=self.watch, name="harnessrl-stop-watch", daemon=True).start()

    def _exiting(self) -> None:
        self.exiting = True

    def uninstall(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        for s, h in self.previous.items():
            signal.signal(s, h)
        if REGISTRY.signum is None:  # no stop under way: the watch thread ends (end-of-file)
            atexit.unregister(self._exiting)
            self.wsock.close()

    def watch(self) -> None:
        """Wait for a stop signal; then give the main thread :attr:`grace_s` seconds to end the
        process, and end it from here if it has not."""
        self.rsock.settimeout(None)
        signum = None
        while signum is None:
            try:
                data = self.rsock.recv(64)
            except OSError:
                return
            if not data:
                self.rsock.close()
                return
            hits = [b for b in data if b in STOP_SIGNALS]
            signum = hits[0] if hits else None
        with REGISTRY.lock:
            if REGISTRY.signum is None:
                REGISTRY.signum, REGISTRY.signalled_at = signum, time.monotonic()
        time.sleep(self.grace_s)  # a process that ended in time never wakes up here
        self.hard_stop(signum)

    def hard_stop(self, signum: int) -> None:
        """The main thread did not get there in time: stage record, Prefect states, temporary
        server, then ``os._exit(128 + signum)``. After the main thread's own :meth:`finish` (the
        interpreter's exit is what takes long), only the server and the exit; and nothing when the
        interpreter is not exiting (a caller that catches the ``SystemExit`` and goes on, as a test's
        CLI runner does)."""
        if self.main_finished:
            if not self.exiting:
                return
            stop_temporary_server(wait_s=1.5)
            os._exit(128 + int(signum))
        stage = write_cancelled_stage(signum)
        mark_cancelled(signum, deadline_s=1.5)
        _say(f"{self.what} stopped by {signal_name(signum)} after {self.grace_s:.0f} s (the main thread was busy in "
             f"native code){'; stage ' + stage + ' cancelled' if stage else ''}; artifacts intact: rerun the same "
             "command to resume")
        stop_temporary_server(wait_s=1.5)
        os._exit(128 + int(signum))

    def finish(self, exc: BaseException) -> int:
        """The main thread's stop: records, Prefect states, one line. Returns the exit status."""
        REGISTRY.raised = True
        signum = REGISTRY.signum or int(getattr(exc, "signal", signal.SIGINT))
        stage = write_cancelled_stage(signum) or REGISTRY.cancelled_stage
        if _temporary_server() is not None:
            from flows.server import settle_temporary_server

            # the server records task runs from the event stream: let it catch up (briefly) before marking
            settle_temporary_server(_dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=1), timeout_s=1.5)
        marked = mark_cancelled(signum)
        _say(f"{self.what} stopped by {signal_name(signum)}{': stage ' + stage + ' cancelled' if stage else ''}; "
             + (f"{len(marked)} Prefect run(s) marked Cancelled; " if marked else "")
             + "artifacts intact: rerun the same command to resume")
        self.main_finished = True  # what is left is the interpreter's exit
        return 128 + int(signum)


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def stop_on_signals(what: str = "harnessrl run", grace_s: float = GRACE_S) -> Iterator[None]:
    """Run the body (in the main thread) so that SIGTERM or SIGINT stops it cleanly (see the
    module docstring): the body is unwound by ``TerminationSignal``, the stage record and the
    Prefect runs are marked cancelled, and ``SystemExit(128 + signal)`` is raised; a body that has
    not unwound :data:`GRACE_S` seconds after the signal is ended by the watch thread.

    Raises:
        SystemExit: after a stop, with status 128 + the signal number.
    """
    guard = _Guard(what, grace_s)
    guard.install()
    try:
        yield
    except BaseException as e:
        if not is_stop(e):
            raise
        code = guard.finish(e)
        raise SystemExit(code) from None
    finally:
        guard.uninstall()
