"""System facilities that some tests need (docker daemon, chromium, ...): one place that decides
between skipping and failing.

Locally a missing facility SKIPs the test with the reason; under CI (``HARNESSRL_CI=1``, set by
``.ci/run``, which installs every facility first) it FAILs, so a broken install cannot pass as
skipped tests.
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    """True when ``HARNESSRL_CI=1`` (CI must have every facility)."""
    return os.environ.get("HARNESSRL_CI") == "1"


def require(facility: str, available: bool, how_to_get: str) -> None:
    """Skip (locally) or fail (under ``HARNESSRL_CI=1``) the calling test unless ``available``.

    Args:
        facility: what is needed, for the message (``"chromium + chromedriver"``).
        available: whether it is there.
        how_to_get: how to install it (``"run scripts/setup-chromium.sh"``).
    """
    if available:
        return
    msg = f"{facility} not available ({how_to_get})"
    if in_ci():
        pytest.fail(f"{msg}; HARNESSRL_CI=1 requires it")
    pytest.skip(msg)


def require_vllm_venv() -> "Path":
    """The vLLM venv's interpreter (``.venv-vllm/bin/python``, built by ``scripts/setup-vllm.sh``)."""
    from pathlib import Path

    py = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    require("the vLLM venv .venv-vllm", py.exists(), "run scripts/setup-vllm.sh")
    return py
