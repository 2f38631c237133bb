"""Sandboxes: where model-generated code runs, one per episode, behind one interface."""

from tasks.environments.sandbox.base import ExecResult, ExecStatus, Sandbox
from tasks.environments.errors import SandboxError, SandboxPathError
from tasks.environments.sandbox.factory import make_sandbox

__all__ = ["ExecResult", "ExecStatus", "Sandbox", "SandboxError", "SandboxPathError", "make_sandbox"]
