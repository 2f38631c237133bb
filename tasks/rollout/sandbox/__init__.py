"""Sandboxes: where model-generated code runs, one per episode, behind one interface."""

from tasks.rollout.sandbox.base import ExecResult, ExecStatus, Sandbox
from tasks.harnesses.sandbox_errors import SandboxError, SandboxPathError
from tasks.rollout.sandbox.factory import make_sandbox

__all__ = ["ExecResult", "ExecStatus", "Sandbox", "SandboxError", "SandboxPathError", "make_sandbox"]
