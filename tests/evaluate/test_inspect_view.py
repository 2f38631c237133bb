"""``inspect view`` (inspect-ai's own log viewer) serves a sealed run's Inspect logs: headless
Chromium opens the log list and one log, and sees its samples with their sealed scores. The
screenshot is kept for a look."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.facilities import chromium_missing, free_port, require, stop_process_group

pytestmark = pytest.mark.slow
SHOTS = Path(os.environ.get("HARNESSRL_SCREENSHOTS", "/tmp/harnessrl-screenshots"))


def test_inspect_view_shows_the_sealed_samples(tmp_path):
    require("chromium", chromium_missing())
    from tests.evaluate.test_stage import _cfg, _run
    from tests.flows._browser import driver_for as _driver, wait_js as _wait

    _, store, _, out, *_ = _run(tmp_path, cfg=_cfg(infra_retries=1, bootstrap_resamples=200))
    rows = [r for r in store.rows(out["evaluations"]) if r["checkpoint"] == "base" and r["harness_name"] == "direct"]
    log_dir = Path(store.root) / "evaluate/inspect"
    port = free_port()
    log = open(tmp_path / "view.log", "w")
    view = subprocess.Popen([str(Path(sys.executable).parent / "inspect"), "view", "start", "--log-dir", str(log_dir),
                             "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    driver = None
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/logs", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert view.poll() is None and time.monotonic() < deadline, (tmp_path / "view.log").read_text()[-2000:]
            time.sleep(0.5)
        listing = httpx.get(f"http://127.0.0.1:{port}/api/logs", timeout=10).json()
        assert sorted(f["name"].rsplit("/", 1)[-1] for f in listing["files"]) == sorted(
            p.name for p in log_dir.glob("*.eval")) and len(listing["files"]) == 2 * 2
        driver = _driver(tmp_path, 1100)
        driver.get(f"http://127.0.0.1:{port}/#/logs/base.direct.eval")
        task = min(r["task_id"] for r in rows)  # the first sample row (samples sorted by id, then epoch)
        text = _wait(driver, f"return document.body.innerText.includes({task!r}) && "
                             "document.body.innerText.includes('Samples') ? document.body.innerText : ''")
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "inspect-view.png"))
        assert text, driver.execute_script("return document.body.innerText")[:1000]
        assert "sealed/direct" in text and "harnessrl/" in text and "@base" in text
        n_final = len({(r["task_id"], r["attempt"]) for r in rows})
        assert f"{n_final} Samples" in text, text[-300:]  # one per planned attempt (retries replace, not add)
    finally:
        if driver is not None:
            driver.quit()
        stop_process_group(view)
        log.close()
    print(f"screenshot: {SHOTS / 'inspect-view.png'}")
