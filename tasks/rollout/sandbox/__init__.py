"""Sandboxes: where model-generated code runs, one per episode, behind one interface."""

from tasks.rollout.sandbox.base import ExecResult, Sandbox, SandboxError, make_sandbox

__all__ = ["ExecResult", "Sandbox", "SandboxError", "make_sandbox"]
