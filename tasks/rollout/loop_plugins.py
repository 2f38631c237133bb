"""Loop types that an application runs instead of the harness engine, behind one interface.

The cores (rollout, train, evaluate) run every harness spec whose ``loop_type`` is the engine's
own (``single_turn``, ``react``, ...) through :mod:`tasks.rollout.harness`. Any other loop type
is an application's: it plugs in here with a :class:`LoopPlugin` and the cores call it through
this module, never by importing the application.

Plugins are the ``loop_plugin`` of the registered applications
(:mod:`tasks.registries.applications`), loaded on the first lookup, or registered in code with
:func:`register_loop_plugin` (tests, notebooks).
"""

from __future__ import annotations

from typing import Any, Protocol


class LoopPlugin(Protocol):
    """What the cores need from a loop type run outside the harness engine.

    ``loop_type``: the harness specs' ``loop_type`` it runs. ``state_artifact``: the name of the
    rollout-stage artifact holding the state it fits on the train split before any episode runs
    (one row per harness; the evaluate stage seals it into the plan), or None when it fits none.
    ``trains_online``: whether its episodes can be trained with ``train.mode: online``.
    """

    loop_type: str
    state_artifact: str | None
    trains_online: bool

    def fit(self, policy: Any, cfg: Any, specs: dict[str, Any], tasks: dict[str, dict[str, Any]],
            records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, tuple[list[dict[str, Any]], str]]]:
        """Fit the state of every harness of this loop type among ``records`` (train split) with the
        base ``policy``. Returns ``(state rows, {artifact name: (rows, contract)})``: the rows of
        ``state_artifact`` and any further artifacts to write beside it."""
        ...

    def states(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``state_artifact`` rows -> ``{harness_id: state}`` as :meth:`run_records` takes it."""
        ...

    def run_records(self, policy: Any, cfg: Any, spec: Any, harness_id: str, tasks: dict[str, dict[str, Any]],
                    records: list[dict[str, Any]], samples: int, seed: int, tag: str, state: Any
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``samples`` episodes per record of one harness, in this process: ``(episodes, turns)``
        rows as :func:`tasks.rollout.runner.run_records` returns them."""
        ...

    def owns_turn(self, action_json: str | None) -> bool:
        """Whether a ``turns.action`` value was written by this loop type (its turns do not chain
        into one growing context)."""
        ...

    def train_sequences(self, episodes: list[dict[str, Any]], turns: list[dict[str, Any]], specs: dict[str, Any]
                        ) -> tuple[list[Any], dict[str, list[dict[str, Any]]]]:
        """Training sequences (:class:`tasks.train.sequences.TrainSequence`) from this loop type's
        episodes and turns, and ``{artifact name: rows}`` for the train stage to write beside its
        own."""
        ...


_REGISTRY: dict[str, LoopPlugin] = {}
_loaded = False


def register_loop_plugin(plugin: LoopPlugin) -> LoopPlugin:
    """Register ``plugin`` for its ``loop_type`` (replacing an earlier one) and return it."""
    _REGISTRY[plugin.loop_type] = plugin
    return plugin


def _load_applications() -> None:
    """Register the loop plugin of every application that has one (once; one registered in code
    first keeps its place)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from tasks.registries.applications import applications

    for app in applications():
        if app.loop_plugin is not None and app.loop_type not in _REGISTRY:
            register_loop_plugin(app.loop_plugin())


def loop_plugin(loop_type: str) -> LoopPlugin | None:
    """The plugin that runs ``loop_type``, or None when the harness engine runs it itself."""
    if loop_type not in _REGISTRY:
        _load_applications()
    return _REGISTRY.get(loop_type)


def plugin_of(spec: Any) -> LoopPlugin | None:
    """The plugin that runs the harness ``spec`` (its ``loop_type``), or None."""
    return loop_plugin(spec.loop_type)


def plugins() -> list[LoopPlugin]:
    """Every registered plugin (the applications' loaded), by loop type."""
    _load_applications()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def state_artifacts() -> list[str]:
    """The names of the rollout-stage state artifacts of every registered plugin."""
    return [p.state_artifact for p in plugins() if p.state_artifact]


def owns_turn(action_json: str | None) -> LoopPlugin | None:
    """The plugin whose loop type wrote this ``turns.action`` value, or None."""
    for p in plugins():
        if p.owns_turn(action_json):
            return p
    return None
