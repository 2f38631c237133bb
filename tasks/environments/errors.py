"""The environments' exceptions (the sandbox's and the browser's), in a module that imports
nothing: the harness tools (:mod:`tasks.harnesses.tools`) and the episode loop raise and catch them
without importing a backend, the configuration or the rollout package."""

from __future__ import annotations

__all__ = ["BrowserError", "SandboxError", "SandboxPathError"]


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, missing backend, its exec server stopped
    answering): an infrastructure error, never the result of a command."""


class SandboxPathError(ValueError):
    """A ``write_file``/``read_file`` path the sandbox refuses: absolute, with ``..``, through a
    symlink, not a regular file, or larger than the read limit. The message names the path."""


class BrowserError(RuntimeError):
    """The browser itself failed (could not start, crashed): an infrastructure error."""
