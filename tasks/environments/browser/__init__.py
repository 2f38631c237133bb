"""Browser environments for ``browser`` tasks (MiniWoB++): one session per episode.

A session shows the agent a text rendering of the page in which every element it can act on
carries a reference (``[12] button "Submit"``); the agent acts with ``click(ref)`` and
``type(ref, text)``. Each suite registers a factory for its ``verifier_kind`` with
:func:`register_browser`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from tasks.environments.errors import BrowserError

__all__ = ["BrowserError", "BrowserFactory", "BrowserSession", "open_browser", "register_browser"]


class BrowserSession(Protocol):
    """One page for one episode.

    ``observe()`` is the current text rendering (element references in square brackets);
    ``click``/``type`` act on a reference and return the new rendering (or a message saying why the
    action did nothing, e.g. an unknown reference); ``reward()`` is the task's own reward mapped to
    [0, 1]; ``done()`` is True once the task has ended (the agent may stop). Raise BrowserError
    for infrastructure failures only, never for a bad action.
    """

    def observe(self) -> str: ...

    def click(self, ref: str) -> str: ...

    def type(self, ref: str, text: str) -> str: ...

    def done(self) -> bool: ...

    def reward(self) -> float: ...

    def close(self) -> None: ...


# (task row from the ``tasks`` artifact, episode seed) -> a started session
BrowserFactory = Callable[[dict[str, Any], int], BrowserSession]
_FACTORIES: dict[str, BrowserFactory] = {}


def register_browser(verifier_kind: str) -> Callable[[BrowserFactory], BrowserFactory]:
    def deco(fn: BrowserFactory) -> BrowserFactory:
        _FACTORIES[verifier_kind] = fn
        return fn

    return deco


def open_browser(task: dict[str, Any], seed: int) -> BrowserSession:
    """A started session for ``task`` (a ``tasks`` row with ``environment == "browser"``).

    A factory is registered when its module is imported (a suite imports its own browser, e.g.
    :mod:`tasks.records.suites.miniwob`); the caller imports the suites first
    (:func:`tasks.records.suites.base.import_suite_modules`, as the episode loop does).

    Raises:
        BrowserError: no browser factory for the task's verifier kind, or the browser cannot start.
    """
    fn = _FACTORIES.get(task["verifier_kind"])
    if fn is None:
        raise BrowserError(f"task {task['task_id']!r}: no browser for verifier kind {task['verifier_kind']!r}; "
                           f"known: {sorted(_FACTORIES)}")
    return fn(task, seed)
