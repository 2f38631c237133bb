"""Deployments end to end: a real Prefect server on loopback (SQLite), ``harnessrl deploy`` registers
prefect.yaml's pipeline deployment (cron schedule, config path parameter), a real process worker
runs a flow run of it on the tiny model, and the flow run, its stage task runs and the report
artifact are read back through the API; then headless Chromium opens the run in the Prefect UI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.facilities import bwrap_missing, chromium_missing, free_port, require, stop_process_group
from tests.flows._browser import analyzed_folder, driver_for, wait_js

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("HARNESSRL_SCREENSHOTS", "/tmp/harnessrl-screenshots"))
PREFECT = str(Path(sys.executable).parent / "prefect")
STAGES = ["freeze", "rollout", "train", "evaluate", "analyze"]
pytestmark = pytest.mark.slow




@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``prefect server start`` on a free loopback port with its own PREFECT_HOME (SQLite).
    Yields (api_url, ui_url, env for child processes)."""
    home = tmp_path_factory.mktemp("prefect-server-home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_API_URL": api, "PREFECT_API_URL": api, "HARNESSRL_PROGRESS": "0",
           "PREFECT_LOGGING_EXTRA_LOGGERS": "harnessrl"}
    log = open(home / "server.log", "w")
    p = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start: {(home / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield api, f"http://127.0.0.1:{port}", env
    finally:
        stop_process_group(p)
        log.close()


def test_deploy_run_through_worker_and_read_back(server, tiny_model_dir, tmp_path):
    require("bubblewrap", bwrap_missing())
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterKey, FlowRunFilter,
                                                FlowRunFilterParentFlowRunId, LogFilter, LogFilterFlowRunId)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.flows.test_ops_faults import tiny_config

    api, ui, env = server
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config(tiny_model_dir, name="deployed")))
    run_dir = tmp_path / "run"

    t0 = time.monotonic()
    dep = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "pipeline"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=180)
    assert dep.returncode == 0, dep.stdout + dep.stderr
    # one summary table (Prefect's own deploy prints one per deployment)
    assert "1 deployment(s) registered" in dep.stdout and dep.stdout.count("┏") == 1, dep.stdout
    assert "harnessrl/pipeline" in dep.stdout and "prefect worker start --pool harnessrl-process" in dep.stdout
    t_deploy = time.monotonic() - t0

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        d = client.read_deployment_by_name("harnessrl/pipeline")
        assert d.parameters == {"config": "configs/default.yaml"} and d.work_pool_name == "harnessrl-process"
        (sched,) = client.read_deployment_schedules(d.id)
        assert sched.schedule.cron == "0 3 * * *" and sched.active is False
        run = client.create_flow_run_from_deployment(d.id, parameters={"config": str(cfg_path),
                                                                      "run_dir": str(run_dir)})
        wlog = open(tmp_path / "worker.log", "w")
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "harnessrl-process", "--type", "process"],
                                  cwd=REPO, env=env, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while True:
                fr = client.read_flow_run(run.id)
                if fr.state is not None and fr.state.is_final():
                    break
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(2)
            # The run's state turns final before its process has sent its last log lines (the stage
            # summaries); the worker, and the flow-run process in its group, stay up until they are in.
            logs = []
            while time.monotonic() < deadline and not all(
                    any(f"stage {s}: " in g.message for g in logs) for s in STAGES):
                time.sleep(1)
                logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        finally:
            stop_process_group(worker)
            wlog.close()
        t_run = time.monotonic() - t0 - t_deploy
        assert fr.state.is_completed(), (fr.state, (tmp_path / "worker.log").read_text()[-3000:])
        assert fr.deployment_id == d.id and fr.parameters["config"] == str(cfg_path)
        for s in STAGES:
            assert any(f"stage {s}: " in g.message for g in logs), f"stage {s}'s log line never reached the API"

        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
        # the five stage subflows, and the report's tables in a subflow run of their own
        assert len(children) == 6 and all(c.state.is_completed() for c in children)
        flow_names = {client.read_flow(c.flow_id).name for c in children}
        assert flow_names == set(STAGES) | {"report-tables"}, flow_names
        # named and tagged from the config (the entry flow loads it in its body and renames its run)
        from flows.naming import run_label
        from tasks.config import load_config

        label = run_label(load_config(cfg_path))
        assert fr.name == label and {"harnessrl", "deployed"} <= set(fr.tags), (fr.name, fr.tags)
        # the run was created under a random name; renamed at its start, its logs say the config's
        assert run.name != label and any(label in g.message for g in logs)
        # only the worker's line from before the run's process started says the name it was created under
        assert [g.message for g in logs if run.name in g.message] == [
            f"Flow run '{run.name}' submitted to infrastructure"], [g.message for g in logs if run.name in g.message]
        assert sorted(c.name for c in children) == sorted(f"{s} · {label}" for s in [*STAGES, "report-tables"])
        assert all("deployed" in c.tags for c in children), [c.tags for c in children]
        children = [c for c in children if client.read_flow(c.flow_id).name != "report-tables"]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [c.id for c in children]}))
        assert sorted(t.name.rsplit("-", 1)[0] for t in tasks) == sorted(STAGES)
        assert all(t.state.is_completed() for t in tasks)
        (art,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["harnessrl-report"])))
        assert art.flow_run_id == run.id and art.type == "markdown"
        md = (run_dir / "analyze/report.md").read_text()  # the UI's copy has the figures inlined
        assert art.data.split("![")[0] == md.split("![")[0] and "pass@1" in art.data and "](plots/" not in art.data
    assert (run_dir / "analyze/mismatch.parquet").is_file()
    print(f"deploy {t_deploy:.1f} s, worker run {t_run:.1f} s")

    # G. the flow run in the Prefect UI (headless Chromium through selenium). The page renders, then
    # fetches the run's logs: the browser waits, up to two minutes, for every stage's log line
    # instead of reading the page once.
    require("chromium", chromium_missing())
    shot = tmp_path / "flow-run.png"
    driver = driver_for(tmp_path, 8000)  # tall: the whole log list is in the screenshot
    try:
        driver.get(f"{ui}/runs/flow-run/{run.id}")
        want = " && ".join(f"t.includes({f'stage {s}: '!r})" for s in STAGES)
        page = "const t = document.documentElement.outerHTML; return "
        seen = wait_js(driver, f"{page}{want} && t.includes({fr.name!r})", timeout_s=120.0)
        dom = driver.page_source
        driver.save_screenshot(str(shot))
        (tmp_path / "flow-run.html").write_text(dom)
        for s in STAGES:
            assert f"stage {s}: " in dom, f"stage {s} not on the flow-run page"
        assert seen and fr.name in dom
        # the report artifact's own page: its key and the rendered markdown
        driver.get(f"{ui}/artifacts/key/harnessrl-report")
        title = f"harnessrl report of {run_dir}"
        seen = wait_js(driver, f"{page}t.includes('Artifact: harnessrl-report') && t.includes({title!r})",
                       timeout_s=120.0)
        art_dom = driver.page_source
        (tmp_path / "artifact.html").write_text(art_dom)
        assert seen and "Artifact: harnessrl-report" in art_dom and title in art_dom, art_dom[-2000:]
    finally:
        driver.quit()
    assert shot.is_file() and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_report_artifact_shows_every_figure_and_fits_1400px(server, tmp_path):
    """The report in the Prefect UI: a flow run publishes a report with figures; headless Chromium opens
    the report artifact's page (every image loaded, naturalWidth > 0; no table wider than a 1400 px
    window) and the flow run's artifacts tab (the report is the first card)."""
    require("chromium", chromium_missing())
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.stages import publish_report

    api, ui, _ = server
    run_dir, n_figs = analyzed_folder(tmp_path / "run")

    @flow(name="report-ui")
    def show() -> list[str]:
        return publish_report(run_dir)

    with temporary_settings({PREFECT_API_URL: api}):
        state = show(return_state=True)
        keys = state.result()
        assert keys[-1] == "harnessrl-report" and "harnessrl-predictors" in keys and "harnessrl-p1-points" in keys
        with get_client(sync_client=True) as client:
            fr_id = state.state_details.flow_run_id
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[fr_id])))
    assert [a.key for a in arts] == ["harnessrl-report"]  # the run's own artifact; tables in the subflow run
    report = arts[0]
    assert report.data.count("data:image/png;base64,") == n_figs and "](plots/" not in report.data

    SHOTS.mkdir(parents=True, exist_ok=True)
    driver = driver_for(tmp_path, 9000)
    try:
        driver.get(f"{ui}/artifacts/artifact/{report.id}")
        n = wait_js(driver, "const i = [...document.images].filter(x => x.src.startsWith('data:image/png'));"
                          f"return i.length >= {n_figs} && i.every(x => x.complete) ? i.length : 0")
        imgs = driver.execute_script("return [...document.images].filter(x => x.src.startsWith('data:image/png'))"
                                     ".map(x => [x.alt, x.naturalWidth, x.naturalHeight])")
        driver.save_screenshot(str(SHOTS / "report-artifact.png"))
        assert n == n_figs and len(imgs) == n_figs, imgs
        assert all(w > 0 and h > 0 for _, w, h in imgs), imgs  # every figure decoded, none broken
        # tables readable at 1400 px: none is cut off at the right or wider than the window
        tables = driver.execute_script(
            "return [...document.querySelectorAll('table')].map(t => { const r = t.getBoundingClientRect();"
            "return [t.rows[0].innerText.slice(0, 40), Math.round(r.right), t.scrollWidth, t.clientWidth]; })")
        width = driver.execute_script("return document.documentElement.clientWidth")
        assert len(tables) >= 3, tables
        assert all(right <= width and sw <= cw + 1 for _, right, sw, cw in tables), (width, tables)
        text = driver.execute_script("return document.body.innerText")
        assert "P1's claim test" in text and "n/a" in text and "Prefect" in driver.title

        # the flow run's artifacts tab: the report is the first (and only) card; the tables went to a subflow run
        driver.set_window_size(1400, 1400)
        driver.get(f"{ui}/runs/flow-run/{fr_id}")
        leaf = "[...document.querySelectorAll('*')].find(e => e.children.length === 0 && e.textContent.trim() === 'Artifacts')"
        assert wait_js(driver, f"return !!{leaf}")
        driver.execute_script(f"{leaf}.click()")
        cards = wait_js(driver, "return [...document.querySelectorAll('.artifact-card__title')].map(e => e.textContent.trim())")
        driver.save_screenshot(str(SHOTS / "flow-run-artifacts.png"))
        assert cards and cards[0] == "harnessrl-report", cards
    finally:
        driver.quit()
    print(f"screenshots: {SHOTS / 'report-artifact.png'}, {SHOTS / 'flow-run-artifacts.png'}")
