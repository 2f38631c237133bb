"""The applications: experiments that run beside the pipeline or plug a loop type into it (P3's
TalkMesh, P2's BiPA, the next one), each registered with what it contributes. The cores, the
stages and the CLI reach an application only through this registry, never by its name.

An application registers one :class:`Application` from its own ``application`` module; the
modules to import are listed in one place, :data:`tasks.applications.APPLICATION_MODULES`, and
imported (by name, so no core imports an application) on the first lookup here.

Pure Python at import: an application's hooks import its heavy modules when called.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tasks.registries.registry import Registry


@dataclass(frozen=True)
class Application:
    """What one application contributes. Every hook is optional (None: it contributes none).

    Attributes:
        name: its command (``harnessrl <name>``), the top-level section of its run config, the
            folder of its artifacts in a run folder and its Prefect flow (``harnessrl-<name>``).
        title: its name in prose (``"TalkMesh"``; messages say it).
        paper: the seed paper its runs reproduce (``"P3"``): the tag of a run whose config name
            starts with ``name``.
        help: the help text of its command.
        config_help: the ``--config`` help of its command; ``set_help`` its ``--set`` help.
        takes_quick: whether its command (and ``harnessrl findings`` for its configs) takes ``--quick``.
        load_config: ``(path, overrides, quick) -> run config``; raises ``ConfigError``.
        run: ``(run_dir, cfg, frozen) -> {name: ArtifactRef}``: its work after the cached freeze
            stage, one Prefect task; writes ``<name>/report.md`` in the run folder.
        loop_type: the harness ``loop_type`` it runs instead of the harness engine, if any.
        loop_plugin: ``() -> LoopPlugin`` (:mod:`tasks.rollout.loop_plugins`) that runs it.
        harness_block: the key of the harness-spec section its loop type needs (``mesh``);
            ``harness_block_model`` the pydantic model that validates it.
        check_harness: ``(spec) -> None``, raising ValueError: the rest of the validation of a
            spec of ``loop_type`` (its block is already validated).
        engine_tables: whether its loop type's episodes enter the tables built on one growing
            engine context (log-odds, branching, step failures, zero-advantage leakage).
        analysis_note: ``(harness names) -> str``: the analysis report's note on its harnesses
            being left out of those tables.
        report_section: ``(store, inputs, evals, eval_turns, harness names) -> markdown``: its
            section appended to the pipeline's analysis report.
        owns_run: ``(run folder) -> bool``: whether the folder is a run sealed by this
            application's own plan (``harnessrl verify`` then calls ``verify``).
        verify: ``(store, public_key) -> VerifyReport``: recompute the run's seal.
        recompute_note: ``(store) -> str | None``: the line ``harnessrl verify`` prints when the
            run's tables were written on another numpy kernel.
        claims_config: ``(YAML mapping) -> bool``: whether a config file is a config of this
            application (``harnessrl findings`` then calls ``findings``).
        findings: ``(config path, run folder or None, overrides, quick, append path or None,
            say) -> None``: ``harnessrl findings`` for its runs (raises ``CommandError``).
    """

    name: str
    title: str = ""
    paper: str | None = None
    help: str = ""
    config_help: str = "its run config"
    set_help: str = "override a config key"
    takes_quick: bool = False
    load_config: Callable[[Path, dict[str, Any], bool], Any] | None = None
    run: Callable[[str, Any, dict[str, Any]], dict[str, Any]] | None = None
    loop_type: str | None = None
    loop_plugin: Callable[[], Any] | None = None
    harness_block: str | None = None
    harness_block_model: type | None = None
    check_harness: Callable[[Any], None] | None = None
    engine_tables: bool = True
    analysis_note: Callable[[list[str]], str] | None = None
    report_section: Callable[..., str] | None = None
    owns_run: Callable[[Path], bool] | None = None
    verify: Callable[[Any, bytes | None], Any] | None = None
    recompute_note: Callable[[Any], str | None] | None = None
    claims_config: Callable[[dict[str, Any]], bool] | None = None
    findings: Callable[..., None] | None = None


APPLICATIONS: Registry[Application] = Registry("application", "applications")
_loaded = False


def _load() -> None:
    """Import every module of :data:`tasks.applications.APPLICATION_MODULES` once (each registers
    its application)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from tasks.applications import APPLICATION_MODULES

    for module in APPLICATION_MODULES:
        importlib.import_module(module)


def applications() -> tuple[Application, ...]:
    """Every registered application, in registration order."""
    _load()
    return APPLICATIONS.entries()


def application(name: str) -> Application:
    """The application ``name``. Raises ValueError naming the registered ones."""
    _load()
    return APPLICATIONS.get(name)


def of_loop_type(loop_type: str) -> Application | None:
    """The application that runs harnesses of ``loop_type``, or None (the harness engine runs it)."""
    return next((a for a in applications() if a.loop_type == loop_type), None)


def loop_types() -> tuple[str, ...]:
    """The loop types the applications run, in registration order."""
    return tuple(a.loop_type for a in applications() if a.loop_type)


def of_harness_block(key: str) -> Application | None:
    """The application whose loop type's harness-spec section is ``key``, or None."""
    return next((a for a in applications() if a.harness_block == key), None)


def enters_engine_tables(loop_type: str) -> bool:
    """Whether episodes of ``loop_type`` enter the tables built on one growing engine context (every
    engine loop type does; an application's says :attr:`Application.engine_tables`)."""
    app = of_loop_type(loop_type)
    return app is None or app.engine_tables


def paper_of_name(config_name: str) -> str | None:
    """The paper of the application whose name starts the (lower-case) config name, or None."""
    low = config_name.lower()
    return next((a.paper for a in applications() if a.paper and low.startswith(a.name)), None)


def applications_apart(specs: dict[str, Any]) -> list[tuple[Application, list[str]]]:
    """``(application, sorted harness names)`` for each application whose loop type's episodes stay
    out of the engine tables (``engine_tables`` False) and that runs harnesses among ``specs``
    (``{harness_id: HarnessSpec}``), in registration order."""
    out = []
    for app in applications():
        if app.loop_type and not app.engine_tables:
            names = sorted({s.name for s in specs.values() if s.loop_type == app.loop_type})
            if names:
                out.append((app, names))
    return out
