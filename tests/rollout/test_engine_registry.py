"""The engine registry (tasks/config/engines.py): every engine the config accepts is in it, each
entry's class is in tasks/rollout/engines/ and has what its entry says it can do, and the factory,
the train stage and the config read the registry instead of testing engine names."""

from __future__ import annotations

import typing

import pytest

from tasks.config import PolicyConfig
from tasks.config.engines import ENGINES, engine_entry, online_engines
from tasks.rollout.engines import engine_class, make_policy
from tasks.rollout.engines.base import PolicyEngine, WeightSyncEngine


def _methods(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}


def test_the_registry_holds_exactly_the_engines_the_config_accepts():
    accepted = typing.get_args(PolicyConfig.model_fields["engine"].annotation)
    assert tuple(ENGINES) == accepted == ("hf", "vllm", "openai")
    assert online_engines() == ["hf", "vllm"]


def test_the_interface_declares_what_online_training_needs():
    assert _methods(PolicyEngine) == {"generate", "close"}
    assert _methods(WeightSyncEngine) == {"load_weights", "load_adapter", "score"}
    assert PolicyEngine in WeightSyncEngine.__mro__


@pytest.mark.parametrize("name", list(ENGINES))
def test_each_engine_class_lives_in_rollout_engines_and_has_what_its_entry_says(name):
    cls = engine_class(name)
    entry = ENGINES[name]
    assert cls.__module__.startswith("tasks.rollout.engines.") and cls.__name__ == entry.factory.split(":")[1]
    has = {m for m in ("generate", "close", "load_weights", "score", "from_model") if callable(getattr(cls, m, None))}
    assert {"generate", "close"} <= has
    assert ({"load_weights", "score"} <= has) == (entry.online == "in_place")
    assert ("from_model" in has) == (entry.online == "in_process")


def test_an_unknown_engine_is_refused_in_one_line(tiny_model_dir):
    cfg = PolicyConfig.model_construct(engine="tensorrt")
    with pytest.raises(ValueError, match=r"^policy.engine='tensorrt' is not one of \('hf', 'vllm', 'openai'\)$"):
        make_policy(tiny_model_dir, cfg, base_model_id="tiny")
    with pytest.raises(ValueError, match=r"^policy.engine='' is not one of"):
        engine_entry("")


def test_the_factory_makes_the_registered_class(tiny_model_dir):
    pol = make_policy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), engine="hf"), base_model_id="tiny")
    assert type(pol) is engine_class("hf") and isinstance(pol, PolicyEngine) and not isinstance(pol, WeightSyncEngine)
    assert pol.policy_id == "tiny"
    pol.close()
