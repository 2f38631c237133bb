"""Policy engines behind one interface (:class:`tasks.rollout.engines.base.PolicyEngine`):

* ``hf``: :class:`tasks.rollout.engines.hf.HFPolicy`, transformers ``generate`` in this process;
* ``vllm``: :class:`tasks.rollout.engines.vllm_engine.VLLMPolicy`, ``vllm.LLM`` in a worker
  process run by the ``.venv-vllm`` interpreter (``scripts/setup-vllm.sh``);
* ``openai``: :class:`tasks.rollout.engines.openai_engine.OpenAIPolicy`, any OpenAI-compatible
  completions server that returns token ids and processed log-probs (``vllm serve``).

Each returns, per prompt, the completion's token ids and the sampler's log-probs under the
processed sampling distribution, so the trainer's recomputation on the same weights agrees.
``policy.engine`` in the run config picks one through the registry
:data:`tasks.config.engines.ENGINES` (:func:`make_policy`), which also says what each engine can do.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from tasks.config import PolicyConfig
from tasks.config.engines import engine_entry


def engine_class(name: str) -> Any:
    """The class of the engine ``name`` (:data:`tasks.config.engines.ENGINES`), imported now.

    Raises:
        ValueError: a name not in the registry.
    """
    module, _, attr = engine_entry(name).factory.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_policy(model_dir: Path, cfg: PolicyConfig, *, base_model_id: str, adapter_dir: Path | None = None) -> Any:
    """The policy engine ``cfg.engine`` for the model folder ``model_dir`` (the tokenizer, and the
    weights for ``hf`` and ``vllm``) with an optional LoRA adapter folder.

    Every engine has ``close()``; those that hold a worker or connections also work as context
    managers.

    Raises:
        ValueError: an engine name not in :data:`tasks.config.engines.ENGINES`.
        tasks.rollout.engines.base.EngineError: the engine cannot start (see each engine).
    """
    return engine_class(cfg.engine)(model_dir, cfg, base_model_id=base_model_id, adapter_dir=adapter_dir)


def close_policy(policy: Any) -> None:
    """Shut down an engine that holds a process or connections (vLLM worker, HTTP pool); a policy
    without ``close()`` (a scripted test policy) is left as it is."""
    close = getattr(policy, "close", None)
    if callable(close):
        close()


def load_policy(cfg: Any, adapter_dir: Any = None) -> Any:
    """The rollout policy of a run config's ``policy.engine`` (hf | vllm | openai) on
    ``policy.model`` (resolved: :func:`tasks.rollout.models.resolve_model`) with an optional LoRA
    adapter folder (:func:`make_policy`)."""
    from tasks.rollout.models import model_id, resolve_model

    path = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    return make_policy(path, cfg.policy, base_model_id=model_id(path), adapter_dir=adapter_dir)
