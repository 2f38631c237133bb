"""A Prefect server on another port than 4200, started as docs/operations.md says: the UI it
serves is handed that port's API (``/ui-settings``); started without the two exports, the UI would
call port 4200, which is why the docs set both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.facilities import free_port, stop_process_group

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _documented_block() -> str:
    """The operations page's shell block that starts a server on another port."""
    text = (REPO / "docs/operations.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "PREFECT_UI_API_URL" in b]
    assert len(blocks) == 1, "docs/operations.md: one bash block starts a server on another port"
    return blocks[0]


def _ui_api_url(script: str, home: Path, port: int) -> str:
    """Run ``script`` (ending in a background ``prefect server start``) with a clean Prefect
    environment; return the API URL the server hands its UI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    script = script.rstrip().removesuffix("&").rstrip()  # the server in the foreground of its session
    log = open(home / "server.log", "w")
    p = subprocess.Popen(["bash", "-c", f"set -e\n{script}"], env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=2)
                if r.status_code == 200:
                    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200  # the UI itself
                    return r.json()["api_url"]
            except httpx.HTTPError:
                pass
            assert p.poll() is None and time.monotonic() < deadline, (home / "server.log").read_text()[-2000:]
            time.sleep(0.5)
    finally:
        stop_process_group(p)
        log.close()


def test_a_server_on_another_port_hands_its_ui_that_port(tmp_path):
    block = _documented_block()
    assert "PORT=4300" in block and "--port $PORT" in block
    port = free_port()
    (tmp_path / "documented").mkdir()
    assert _ui_api_url(block.replace("PORT=4300", f"PORT={port}"), tmp_path / "documented", port) == \
        f"http://127.0.0.1:{port}/api"
    # without the exports the UI is handed port 4200 (where nothing, or another server, answers)
    bare = "\n".join(line for line in block.splitlines() if not line.startswith("export "))
    port = free_port()
    (tmp_path / "bare").mkdir()
    assert _ui_api_url(bare.replace("PORT=4300", f"PORT={port}"), tmp_path / "bare", port).endswith(":4200/api")
