"""The run report in the Prefect UI: a real Prefect server (SQLite, loopback), a flow run that
publishes a report with figures, then headless Chromium (selenium) opens the report artifact's page
and the flow run's artifacts tab: every image loaded (naturalWidth > 0), no table wider than a
1400 px window, and the report is the run's first artifact. Screenshots are kept for a look."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.facilities import chromium_missing, require
from tests.flows.test_ops_deploy import server  # noqa: F401  (the module-scoped Prefect server fixture)

pytestmark = pytest.mark.slow
SHOTS = Path(os.environ.get("HARNESSRL_SCREENSHOTS", "/tmp/harnessrl-screenshots"))


def _analyzed_folder(root: Path) -> tuple[str, int]:
    """A run folder with what publish_report reads: the P1 tables, four figures and the report
    (rendered by the real functions from a small synthetic sealed evaluation)."""
    import numpy as np

    from schemas import ArtifactStore
    from tasks.analysis import plots
    from tasks.analysis.ceiling import mismatch_cells
    from tasks.analysis.predictors import p1_points, r2_table
    from tasks.analysis.report import ReportInputs, render_report
    from tests.analysis._rows import ev

    rng = np.random.default_rng(0)
    evals = [ev(ck, h, f"t{t}", a, "resolved" if rng.random() < p * lift else "unresolved")
             for h, p in (("direct", 0.2), ("react-python", 0.4), ("qwen-code-like", 0.3))
             for ck, lift in (("base", 1.0), ("within", 1.3), ("cross", 1.6)) for t in range(6) for a in range(4)]
    store = ArtifactStore(root)
    mismatch = mismatch_cells(evals, k=4, beta=1.0)
    for r in mismatch:
        r["mismatch_step"] = r["predicted_return"] = None
    preds = r2_table(evals, k=4, beta=1.0, resamples=200)
    points = p1_points(evals, k=4, beta=1.0)
    for name, rows in (("mismatch", mismatch), ("predictors", preds), ("p1_points", points)):
        store.write("analyze", name, rows)
    steps = [{"arm": a, "step": s, "loss": 0.1, "kl": 0.001 * s, "entropy": 1.0, "clip_frac": 0.05, "grad_norm": 0.5,
              "reward_mean": 0.2 + 0.1 * s, "zero_adv_frac": 0.4} for a in ("within", "cross") for s in (1, 2, 3)]
    leak = [{"rule": r, "zero_groups": z, "n_groups": 10, "zero_group_fraction": z / 10, "accuracy": acc,
             "null_mean": 0.5, "leakage_pp": (acc - 0.5) * 100, "ci_low": -3.0, "ci_high": 3.0, "p_value": 0.01,
             "note": ""} for r, z, acc in (("within", 6, 0.51), ("cross", 3, 0.7))]
    figs = {"learning_curves": plots.learning_curves(steps), "ceiling_vs_return": plots.ceiling_vs_return(mismatch),
            "r2_comparison": plots.r2_comparison(preds), "leakage": plots.leakage_plot(leak)}
    assert all(v is not None for v in figs.values())
    for name, png in figs.items():
        store.write_bytes(f"analyze/plots/{name}.png", png)
    report = render_report(ReportInputs(
        run_name="ui", config_hash="c" * 64, model="smollm2-135m-instruct", plan_hash="p" * 64, seal_head="s" * 64,
        episodes=[{"harness_name": "direct", "reward": 1.0, "success": True, "num_turns": 1}], train_steps=steps,
        timing=[], eval_cells=[], eval_contrasts=[], mismatch=mismatch, predictors=preds, p1_points=points,
        leakage=leak, figures={n: f"plots/{n}.png" for n in figs}))
    store.write_text("analyze/report.md", report)
    return str(root), len(figs)


def _driver(tmp_path: Path, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-background-networking", f"--window-size=1400,{height}",
              f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        opts.add_argument(a)
    opts.binary_location = os.environ.get("MINIWOB_CHROME_BINARY") or "/usr/bin/chromium"
    return webdriver.Chrome(service=Service(os.environ.get("MINIWOB_CHROMEDRIVER") or "/usr/bin/chromedriver"),
                            options=opts)


def _wait(driver, js: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = driver.execute_script(js)
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_report_artifact_shows_every_figure_and_fits_1400px(server, tmp_path):  # noqa: F811
    require("chromium", chromium_missing())
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.stages import publish_report

    api, ui, _ = server
    run_dir, n_figs = _analyzed_folder(tmp_path / "run")

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
    driver = _driver(tmp_path, 9000)
    try:
        driver.get(f"{ui}/artifacts/artifact/{report.id}")
        n = _wait(driver, "const i = [...document.images].filter(x => x.src.startsWith('data:image/png'));"
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
        assert _wait(driver, f"return !!{leaf}")
        driver.execute_script(f"{leaf}.click()")
        cards = _wait(driver, "return [...document.querySelectorAll('.artifact-card__title')].map(e => e.textContent.trim())")
        driver.save_screenshot(str(SHOTS / "flow-run-artifacts.png"))
        assert cards and cards[0] == "harnessrl-report", cards
    finally:
        driver.quit()
    print(f"screenshots: {SHOTS / 'report-artifact.png'}, {SHOTS / 'flow-run-artifacts.png'}")
