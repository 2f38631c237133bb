"""An application registered in one place is reached by the harness spec, the analysis's engine
tables, the run tags, ``harnessrl verify`` and ``harnessrl findings``, without any of them naming
it: a toy application, added for the test only, is accepted by each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from tasks.evaluate.seal import VerifyReport
from tasks.harnesses.spec import SPEC_DIR, HarnessError, HarnessSpec, load_harness
from tasks.registries.applications import (APPLICATIONS, Application, application, applications,
                                           applications_apart, enters_engine_tables, loop_types)


class ToyBlock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    n: int = Field(ge=1)


def _check(spec) -> None:
    if spec.environments != ["answer"]:
        raise ValueError(f"loop_type toyloop needs environments: [answer], not {spec.environments}")


MARK = "toy/sealed.json"


def _verify(store, public_key):
    data = json.loads(store.read_bytes(MARK))
    return VerifyReport(plan_hash=data["plan"], rows=data["rows"], head=data["head"], fingerprint="SHA256:toy")


TOY = Application(name="toyapp", title="Toy", paper="P9", loop_type="toyloop", harness_block="toy",
                  harness_block_model=ToyBlock, check_harness=_check, engine_tables=False,
                  analysis_note=lambda names: f"toy harnesses {names}: left out",
                  owns_run=lambda rd: (rd / MARK).is_file(), verify=_verify, recompute_note=lambda store: None,
                  claims_config=lambda data: "toyapp" in data)


@pytest.fixture
def toy():
    applications()  # the shipped ones first, as any reader loads them
    with APPLICATIONS.added(TOY):
        yield TOY
    assert "toyapp" not in APPLICATIONS


def _spec(**over) -> dict:
    d = yaml.safe_load((SPEC_DIR / "direct.yaml").read_text())
    return {**d, "name": "toy-direct", "loop_type": "toyloop", "toy": {"n": 2}, **over}


def test_the_shipped_applications_are_registered():
    assert [a.name for a in applications()] == ["bipa", "talkmesh"]
    assert loop_types() == ("talkmesh",) and application("talkmesh").harness_block == "mesh"
    with pytest.raises(ValueError, match=r"application 'nope' is not one of \('bipa', 'talkmesh'\)"):
        application("nope")


def test_a_new_loop_type_and_its_section_reach_the_harness_spec(toy, tmp_path):
    spec = HarnessSpec.model_validate(_spec())
    assert spec.loop_type == "toyloop" and spec.toy == ToyBlock(n=2)
    assert spec.spec_dict()["toy"] == {"n": 2}
    assert HarnessSpec.model_validate(_spec(toy={"n": 3})).harness_id != spec.harness_id
    p = tmp_path / "bad.yaml"
    for over, msg in [({"toy": {"n": 0}}, r"toy\.n=0: Input should be greater than or equal to 1"),
                      ({"toy": None, "loop_type": "toyloop"}, "loop_type toyloop needs a toy"),
                      ({"environments": ["workspace"]}, r"needs environments: \[answer\]"),
                      ({"loop_type": "single_turn"}, "toy section is only for loop_type toyloop, not loop_type "
                                                     "single_turn"),
                      ({"tyo": {"n": 1}}, "tyo: Extra inputs are not permitted")]:
        d = {k: v for k, v in _spec(**over).items() if v is not None}
        p.write_text(yaml.safe_dump(d))
        with pytest.raises(HarnessError, match=msg):
            load_harness(p)
    assert enters_engine_tables("toyloop") is False and enters_engine_tables("react") is True
    direct = load_harness("direct")
    assert applications_apart({"a": spec, "b": direct}) == [(toy, ["toy-direct"])]


def test_without_the_registration_the_loop_type_is_refused():
    with pytest.raises(ValueError, match=r"Input should be 'single_turn', .* or 'talkmesh'"):
        HarnessSpec.model_validate(_spec())


def test_the_run_tags_and_the_commands_reach_it(toy, tmp_path):
    from flows.check_commands import config_owner
    from flows.cli import app
    from flows.naming import paper_of

    assert paper_of("toyapp-small") == "P9" and paper_of("talkmesh-small") == "P3" and paper_of("default") is None
    cfg = tmp_path / "toy.yaml"
    cfg.write_text("toyapp: {k: 1}\n")
    assert config_owner(cfg) is toy and config_owner(Path("configs/default.yaml")) is None
    rd = tmp_path / "run"
    (rd / "toy").mkdir(parents=True)
    (rd / MARK).write_text(json.dumps({"plan": "a" * 64, "rows": 3, "head": "b" * 64}))
    res = CliRunner().invoke(app, ["verify", str(rd)])
    assert res.exit_code == 0 and f"verified: plan {'a' * 16}, 3 sealed rows, head {'b' * 16}, signed by SHA256:toy" \
        in res.output, res.output
    res = CliRunner().invoke(app, ["verify", str(rd), "--witness"])
    assert res.exit_code == 2 and "--witness: not built for a Toy run" in res.output
