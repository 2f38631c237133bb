"""An application's run as a Prefect flow (``harnessrl <application>``): freeze (the pipeline's
cached stage) -> the application's work, one Prefect task named after it, in a flow
``harnessrl-<application>`` (:mod:`tasks.registries.applications`: ``run``)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from prefect import flow, task

from flows.naming import flow_run_namer
from flows.stages import freeze_then
from schemas import ArtifactRef
from tasks.registries.applications import application


def _run_task(run_dir: str, cfg: Any, frozen: dict[str, ArtifactRef], name: str) -> dict[str, ArtifactRef]:
    """The application ``name``'s ``run`` hook."""
    return application(name).run(run_dir, cfg, frozen)


def _flow_body(cfg: Any, run_dir: str, name: str, force_freeze: bool = False) -> dict[str, Any]:
    """Freeze (cached by content like the pipeline's), then the application's task. Returns
    ``{"freeze": refs, name: refs, "seconds": wall-clock seconds of its task}``."""
    run_task = task(name=name, persist_result=False, log_prints=True)(_run_task)
    return freeze_then(name, lambda rd, c, frozen: run_task(rd, c, frozen, name), run_dir, cfg, force_freeze)


@lru_cache(maxsize=None)
def application_flow(name: str) -> Any:
    """The Prefect flow of the application ``name`` (``harnessrl-<name>``): call it with
    ``(cfg, run_dir, force_freeze=False)``.

    Raises:
        ValueError: no application ``name`` is registered, or it has no ``run``.
    """
    if application(name).run is None:
        raise ValueError(f"application {name!r} has no run of its own")

    def body(cfg: Any, run_dir: str, force_freeze: bool = False) -> dict[str, Any]:
        return _flow_body(cfg, run_dir, name, force_freeze)

    body.__doc__ = _flow_body.__doc__
    return flow(name=f"harnessrl-{name}", flow_run_name=flow_run_namer())(body)
