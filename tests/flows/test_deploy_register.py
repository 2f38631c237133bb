"""``harnessrl deploy`` against a Prefect API: the deployments are registered without Prefect's
own per-deployment output, under the pipeline's one flow name, and summed up in one table."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_register_prints_nothing_and_the_summary_is_one_table(prefect_harness, capsys):
    from prefect.client.orchestration import get_client
    from rich.console import Console

    from flows.deploy import load_deployments, register, summary_table
    from flows.naming import PIPELINE_FLOW

    rows = register(REPO / "prefect.yaml")
    printed = capsys.readouterr()
    assert printed.out == "", printed.out  # Prefect's Flow.deploy prints a table per deployment
    declared = [d["name"] for d in load_deployments(REPO / "prefect.yaml")]
    assert [r["deployment"] for r in rows] == [f"{PIPELINE_FLOW}/{n}" for n in declared]
    with get_client(sync_client=True) as client:
        for r in rows:
            d = client.read_deployment_by_name(r["deployment"])
            assert str(d.id) == r["id"] and d.work_pool_name == r["work_pool"] == "harnessrl-process"
            assert client.read_flow(d.flow_id).name == PIPELINE_FLOW
    assert rows[0]["schedule"] == "0 3 * * * UTC (inactive)" and rows[0]["parameters"] == "config=configs/default.yaml"
    assert rows[1]["parameters"] == "config=configs/default.yaml\nstage=freeze"
    console = Console(record=True, width=120)
    console.print(summary_table(rows))
    text = console.export_text()
    assert text.count("deployment(s) registered") == 1 and text.count("┏") == 1  # one table, one header
    assert all(text.count(r["id"]) == 1 for r in rows) and "work pool: harnessrl-process" in text
    assert max(len(line) for line in text.splitlines()) <= 120
