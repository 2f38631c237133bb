"""Starting a sandbox of the configured backend; the only module that imports every backend."""

from __future__ import annotations

from tasks.config import SandboxConfig
from tasks.environments.sandbox.base import Sandbox
from tasks.environments.errors import SandboxError


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """A fresh, started sandbox of the configured backend (``cfg.backend``).

    Raises:
        SandboxError: the backend is not installed or cannot start here (the message says what
            is missing: the bwrap binary, the docker daemon, the sandbox image).
    """
    if cfg.backend == "bwrap":
        from tasks.environments.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(cfg)
    if cfg.backend == "docker":
        from tasks.environments.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(cfg)
    raise SandboxError(f"sandbox.backend={cfg.backend!r} is not available")
