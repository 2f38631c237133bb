"""Headless-Chromium helpers for the UI tests (selenium + chromedriver) and a small analyzed run
folder for the report's UI test."""

from __future__ import annotations

import os
import time
from pathlib import Path


def analyzed_folder(root: Path) -> tuple[str, int]:
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
        episodes=[{"harness_name": "direct", "reward": 1.0, "success": True, "num_turns": 1, "answer_parsed": True}],
        train_steps=steps,
        timing=[], eval_cells=[], eval_contrasts=[], mismatch=mismatch, predictors=preds, p1_points=points,
        leakage=leak, figures={n: f"plots/{n}.png" for n in figs}))
    store.write_text("analyze/report.md", report)
    return str(root), len(figs)


def driver_for(tmp_path: Path, height: int):
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


def wait_js(driver, js: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = driver.execute_script(js)
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.5)
