"""Flow runs in the Prefect UI say which config made them: named from the config's name and hash,
tagged with its name and paper; a stage subflow run says its stage."""

from pathlib import Path

import pytest
import yaml

from flows.naming import paper_of, run_label, run_tags
from tasks.config import RunConfig, load_config

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_config_names_its_paper():
    names = {p.stem: yaml.safe_load(p.read_text())["name"] for p in sorted((REPO / "configs").glob("*.yaml"))}
    assert {n: paper_of(n) for n in names.values()} == {
        "bipa-small": "P2", "default": None, "learn-arith": None, "p1-findings": "P1", "p1-findings-v2": "P1", "p4-findings": "P4",
        "p4-findings-v2": "P4", "p5-findings": "P5", "p2-findings": "P2",
        "p5-beta-pilot": "P5", "p5-beta-pilot-v2": "P5", "p6-findings": "P6", "p6-findings-v2": "P6", "p4-small": "P4", "p5-kl-small": "P5", "p6-gspo-small": "P6",
        "talkmesh-arith": "P3", "talkmesh-findings": "P3", "talkmesh-pipeline": "P3", "talkmesh-small": "P3"}
    assert paper_of("p10-x") is None and paper_of("P5-mine") == "P5" and paper_of("pipeline") is None


def _cfg(name):
    return RunConfig.model_validate({"name": name, "seed": 1,
                                     "suites": [{"name": "basic_arithmetic", "size": 4, "seed": 1}],
                                     "split": {"test_fraction": 0.25}, "harnesses": ["direct"]})


def test_label_is_the_default_run_folder_name_and_tags_add_the_paper():
    cfg = _cfg("p4-mine")
    assert run_label(cfg) == f"p4-mine-{cfg.config_hash()[:10]}"
    assert run_tags(cfg) == ["p4-mine", "P4"] and run_tags(_cfg("learn-arith")) == ["learn-arith"]


def test_stage_subflow_runs_are_named_and_tagged_from_the_config(prefect_harness, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from flows.naming import flow_run_namer, tagged
    from flows.stages import freeze_flow

    cfg = _cfg("p5-naming")

    @flow(name="naming-parent", flow_run_name=flow_run_namer())
    def parent(cfg: RunConfig, run_dir: str):
        return freeze_flow(run_dir, cfg)

    with tagged(cfg):
        state = parent(cfg, str(tmp_path / "run"), return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as client:
        top = client.read_flow_run(state.state_details.flow_run_id)
        (child,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[top.id])))
    label = f"p5-naming-{cfg.config_hash()[:10]}"
    assert top.name == label and child.name == f"freeze · {label}"
    assert sorted(top.tags) == sorted(child.tags) == ["P5", "p5-naming"]


@pytest.mark.parametrize("stage", ["freeze", "rollout", "train", "evaluate", "analyze", "report-tables"])
def test_every_pipeline_flow_has_a_namer(stage):
    import flows.pipeline as P
    import flows.stages as S

    f = getattr(S, {"report-tables": "report_tables_flow"}.get(stage, f"{stage}_flow"))
    assert f.name == stage and f.flow_run_name.__name__ == f"{stage}_flow_run_name"
    for top in (P.pipeline, P.through_train):
        assert top.flow_run_name.__name__ == "run_flow_run_name"


def test_the_cli_and_the_deployments_run_one_flow():
    """``harnessrl run``'s flow and the deployments' entry flow have one name (one flow in the
    Prefect UI, its runs from both side by side), and both name their runs after the config."""
    from flows.deploy import run_config
    from flows.naming import PIPELINE_FLOW
    from flows.pipeline import pipeline

    assert pipeline.name == run_config.name == PIPELINE_FLOW
    assert run_config.flow_run_name.__name__ == pipeline.flow_run_name.__name__ == "run_flow_run_name"


def test_a_run_created_under_another_name_logs_under_the_configs(prefect_harness, tmp_path):
    """A deployment's run is created under a random name; the flow's namer renames it from its
    ``config`` path before the first log line, so no line of its logs says the random name."""
    from prefect import flow, get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.flow_engine import run_flow
    from prefect.logging.handlers import APILogHandler

    from flows.naming import flow_run_namer

    cfg = _cfg("p6-renamed")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))

    @flow(name="naming-deployed", flow_run_name=flow_run_namer())
    def entry(config: str) -> str:
        get_run_logger().info("in the body")
        return config

    with get_client(sync_client=True) as client:
        fr = client.create_flow_run(entry, name="vengeful-panda", parameters={"config": str(path)})
        assert run_flow(entry, flow_run=fr, parameters={"config": str(path)}, return_type="state").is_completed()
        APILogHandler().flush()
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])))
        name = client.read_flow_run(fr.id).name
    label = run_label(load_config(path))
    assert name == label
    assert any("in the body" in g.message for g in logs) and any(label in g.message for g in logs), logs
    assert not [g.message for g in logs if "vengeful-panda" in g.message and "Renamed" not in g.message]
    # a config that does not load names the run by its path's stem (the body then fails with the error)
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [")
    with get_client(sync_client=True) as client:
        fr = client.create_flow_run(entry, name="calm-otter", parameters={"config": str(bad)})
        run_flow(entry, flow_run=fr, parameters={"config": str(bad)}, return_type="state")
        assert client.read_flow_run(fr.id).name == "broken"
