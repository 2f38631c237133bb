"""What a command's logic (in the package it belongs to) hands the command line: a failure as one
line and an exit code (:class:`CommandError`), and the printer it writes through (:data:`Say`).
The command line (``flows/cli.py``) prints the line in the error's colour on stderr and exits."""

from __future__ import annotations

from typing import Protocol


class CommandError(Exception):
    """A command that cannot go on: ``message`` (one line) and the process's exit ``code``
    (1: the run failed a check; 2: bad input, not a run)."""

    def __init__(self, message: str, code: int = 1, color: str = "red"):
        super().__init__(message)
        self.message, self.code, self.color = message, code, color


class Say(Protocol):
    """Print one line: ``say(text, color=None, err=False)`` (``color``: a click colour name;
    ``err``: to stderr)."""

    def __call__(self, text: str, color: str | None = None, err: bool = False) -> None: ...
