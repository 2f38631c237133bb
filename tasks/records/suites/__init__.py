"""Task-suite loaders. Each loader yields :class:`tasks.records.suites.base.Task` records."""

from tasks.records.suites.base import Task, load_suite

__all__ = ["Task", "load_suite"]
