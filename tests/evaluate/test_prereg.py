"""Pre-registration (issue 20, item 5): harnesses, contrasts and alpha sealed at freeze; the
evaluate stage refuses a plan that departs from them, naming the difference; verify re-checks."""

from __future__ import annotations

import json
import os

import pytest

from schemas import ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.prereg import PREREG, PREREG_SIG, preregistration, write_preregistration
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.seal import SealError
from tasks.evaluate.signing import KEY_ENV
from tasks.evaluate.stage import PLAN, run_evaluate
from tasks.evaluate.verify import verify_run


@pytest.fixture(autouse=True)
def _key(tmp_path):
    old = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(tmp_path / "keys" / "k.pem")
    yield
    os.environ.pop(KEY_ENV) if old is None else os.environ.__setitem__(KEY_ENV, old)


def _frozen(tmp_path, cfg):
    from tests.evaluate.test_stage import _store

    store, refs, *_ = _store(tmp_path, cfg)
    write_preregistration(store, cfg)
    return store, refs


def _evaluate(store, refs, cfg):
    return run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(p_resolve={"direct": 0.5, "react-python": 0.3},
                                                                         seed=1))


def _cfg(**ev):
    from tests.evaluate.test_stage import _cfg as base

    return base(bootstrap_resamples=200, **ev)


def test_freeze_stage_writes_and_signs_it_and_the_plan_records_it(tmp_path):
    from flows.stages import freeze_and_preregister

    cfg = _cfg()
    store = ArtifactStore(tmp_path / "fz")
    freeze_and_preregister(store, cfg, {})
    assert store.read_json(PREREG) == preregistration(cfg) and store.exists(PREREG_SIG)
    assert preregistration(cfg) == {"version": 1, "harnesses": ["direct", "react-python"], "held_out": ["react-python"],
                                    "contrasts": "default", "alpha": 0.05}
    store, refs = _frozen(tmp_path, cfg)
    _evaluate(store, refs, cfg)
    plan = store.read_json(PLAN)
    from tasks.hashing import sha256_json
    assert plan["preregistration"] == sha256_json(preregistration(cfg))
    assert verify_run(store).rows > 0


@pytest.mark.parametrize("change,match", [
    ({"alpha": 0.1}, r"alpha: plan 0\.1, pre-registered 0\.05"),
    ({"harnesses": ["direct"]}, r"harnesses: plan \['direct'\], pre-registered \['direct', 'react-python'\]"),
    ({"contrasts": [{"name": "only", "a": {"checkpoint": "final", "harness": "direct"},
                     "b": {"checkpoint": "base", "harness": "direct"}}]},
     r"contrasts: plan \['only'\], pre-registered \['final-vs-base:direct', 'final-vs-base:react-python'\]"),
])
def test_evaluate_refuses_a_plan_that_departs_from_it(tmp_path, change, match):
    store, refs = _frozen(tmp_path, _cfg())
    with pytest.raises(ValueError, match="departs from the pre-registration .*" + match):
        _evaluate(store, refs, _cfg(**change))
    assert not store.exists(PLAN)  # refused before the plan was committed


def test_an_edited_preregistration_is_refused_by_evaluate_and_by_verify(tmp_path):
    cfg = _cfg()
    store, refs = _frozen(tmp_path, cfg)
    _evaluate(store, refs, cfg)
    path = tmp_path / "run" / PREREG
    pre = json.loads(path.read_text())
    pre["alpha"] = 0.2
    path.write_text(json.dumps(pre))
    with pytest.raises(SealError, match=f"{PREREG}: hash .* recorded in the plan"):
        verify_run(store)
    store2, refs2 = _frozen(tmp_path / "b", cfg)
    path2 = tmp_path / "b" / "run" / PREREG
    path2.write_text(json.dumps(dict(json.loads(path2.read_text()), alpha=0.2)))
    with pytest.raises(SealError, match=f"{PREREG_SIG}: signs"):
        _evaluate(store2, refs2, _cfg(alpha=0.2))
