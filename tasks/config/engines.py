"""The policy engines a run config may name, and what each can do: the one registry that the
config's checks, the engine factory (:func:`tasks.rollout.engines.make_policy`) and the train stage's
online sampler read, instead of testing ``policy.engine`` by name.

An engine's class is named by its import path and imported only when the engine is made, so the
configuration (below the rollout package in the import layers) never imports an engine. Every class
implements :class:`tasks.rollout.engines.base.PolicyEngine` (``generate``, ``close``); ``online``
says how ``train.mode: online`` samples with it:

- ``in_place``: one engine, started once on the base model, the trainer's merged weights loaded
  into it after each batch and checked by scoring a probe
  (:class:`tasks.rollout.engines.base.WeightSyncEngine`: ``load_weights``, ``score``; sampled by
  :class:`tasks.train.online.EngineSampler`);
- ``in_process``: the trainer's own model in memory wrapped as a fresh engine each iteration (the
  class's ``from_model``);
- None: the engine cannot sample for online training (a remote server), and a config asking it to is
  refused at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EngineEntry:
    """One engine: ``factory`` (``"module:Class"``) and ``online`` (see the module docstring)."""

    factory: str
    online: Literal["in_place", "in_process"] | None


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry("tasks.rollout.engines.hf:HFPolicy", "in_process"),
    "vllm": EngineEntry("tasks.rollout.engines.vllm_engine:VLLMPolicy", "in_place"),
    "openai": EngineEntry("tasks.rollout.engines.openai_engine:OpenAIPolicy", None),
}


def engine_entry(name: str) -> EngineEntry:
    """The registry entry of ``name``. Raises ValueError (one line, naming the field and value) for
    a name not in :data:`ENGINES`."""
    if name not in ENGINES:
        raise ValueError(f"policy.engine={name!r} is not one of {tuple(ENGINES)}")
    return ENGINES[name]


def online_engines() -> list[str]:
    """The engines that can sample for ``train.mode: online``, sorted."""
    return sorted(n for n, e in ENGINES.items() if e.online is not None)
