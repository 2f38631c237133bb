"""Tests that need a system facility (docker daemon, bubblewrap, chromium, ...) call
:func:`require`: SKIP with the reason when it is missing locally, FAIL when ``HARNESSRL_CI=1``
(CI installs every facility in ``.ci/run``, so a missing one there is a broken setup)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest


def in_ci() -> bool:
    """True when the environment variable ``HARNESSRL_CI`` is ``1``."""
    return os.environ.get("HARNESSRL_CI") == "1"


def require(facility: str, reason: str | None) -> None:
    """Skip (locally) or fail (CI) the calling test when ``reason`` is not None: ``reason`` says
    why ``facility`` is unusable and how to get it."""
    if reason is None:
        return
    msg = f"{facility} unavailable: {reason}"
    if in_ci():
        pytest.fail(f"{msg} (HARNESSRL_CI=1: CI must provide it)", pytrace=False)
    pytest.skip(msg)


def bwrap_missing() -> str | None:
    """None when bubblewrap is installed, else why not."""
    return None if shutil.which("bwrap") else "the 'bwrap' binary is not installed (apt-get install bubblewrap)"


def docker_missing() -> str | None:
    """None when a docker daemon answers and the sandbox image for this checkout is built, else
    why not (cached per process)."""
    global _docker_reason
    if _docker_reason is not _UNSET:
        return _docker_reason
    try:
        import docker

        from tasks.environments.sandbox.image import docker_client, image_tag

        client = docker_client(None)
        tag = image_tag()
        try:
            client.images.get(tag)
            _docker_reason = None
        except docker.errors.ImageNotFound:
            _docker_reason = f"sandbox image {tag} is not built (run scripts/setup-docker.sh)"
    except Exception as e:  # noqa: BLE001 - any failure means: no usable daemon
        _docker_reason = f"no docker daemon answers ({type(e).__name__}: {e}); run scripts/setup-docker.sh as root"
    return _docker_reason


_UNSET = object()
_docker_reason: object = _UNSET


def chromium_missing() -> str | None:
    """None when headless Chromium and its driver are installed (MiniWoB++ browser tasks)."""
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    if chrome and driver and os.path.exists(chrome) and os.path.exists(driver):
        return None
    return "chromium + chromedriver are not installed (run scripts/setup-chromium.sh)"


def require_chromium() -> None:
    """Skip (locally) or fail (CI) unless Chromium and its driver are installed."""
    require("chromium", chromium_missing())


def require_vllm_venv() -> Path:
    """The vLLM venv's interpreter (``.venv-vllm/bin/python``, built by ``scripts/setup-vllm.sh``);
    skips (locally) or fails (CI) when it is missing."""
    py = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    require("the vLLM venv .venv-vllm", None if py.exists() else "run scripts/setup-vllm.sh")
    return py


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session=True``), wait up to
    ``grace_s`` seconds, then SIGKILL it; a group already gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
