"""Resuming a killed TalkMesh run: each finished step's result is kept under
``talkmesh/resume/<key>/<step>.json`` (``key``: the run's TalkMesh config hash and the frozen
tasks' and harnesses' SHA-256), so running the same config into the same folder again reuses the steps that
finished (the proposals, every mesh run, the talk training) instead of generating them anew. The
folder is removed when the run's tables are written.

The key does not cover the code: resuming after changing it (a prompt in talk.py, say) reuses
steps the old code made; delete ``talkmesh/resume/`` to start over. A reused step is its recorded
value, not a recomputation: the run's numbers are those of the
attempts that made each step. The seconds a reused step took when it was made are added to the
run's ``timing`` (``reused_s``), so ``total_s`` counts the whole computation once.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from tasks.talkmesh.mesh import MeshResult, Output, Problem


def encode(value: Any) -> Any:
    """``value`` as JSON-able data: :class:`Output`, :class:`Problem` and :class:`MeshResult` become
    tagged objects (``{"__output__": [...]}``, ...), tuples lists; str, int, float, bool, None, lists
    and string-keyed dicts as they are.

    Raises:
        TypeError: any other type, or a dict key that is not a string.
    """
    if isinstance(value, Output):
        return {"__output__": [value.text, value.answer, list(value.prompt_ids), list(value.token_ids),
                               list(value.logprobs)]}
    if isinstance(value, Problem):
        return {"__problem__": [value.problem_id, value.question, value.verifier_kind, value.verifier_spec]}
    if isinstance(value, MeshResult):
        return {"__mesh__": {"messages": encode(value.messages), "results": encode(value.results),
                             "revisions": encode(value.revisions)}}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"encode: dict keys must be strings, got {[k for k in value if not isinstance(k, str)][:3]}")
        return {k: encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"encode: cannot keep a {type(value).__name__} in a resume step")


def decode(data: Any) -> Any:
    """The inverse of :func:`encode` (lists stay lists; an Output's id and log-prob fields are tuples)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if isinstance(data, dict):
        if set(data) == {"__output__"}:
            text, answer, prompt, ids, logp = data["__output__"]
            return Output(text, answer, tuple(prompt), tuple(ids), tuple(logp))
        if set(data) == {"__problem__"}:
            return Problem(*data["__problem__"])
        if set(data) == {"__mesh__"}:
            m = data["__mesh__"]
            return MeshResult(messages=decode(m["messages"]), results=decode(m["results"]),
                              revisions=decode(m["revisions"]))
        return {k: decode(v) for k, v in data.items()}
    return data


class StepCache:
    """The finished steps of one run (module docstring).

    Args:
        store: the run's :class:`schemas.ArtifactStore`.
        key: hex string naming this run's inputs; steps of another key are never read.
    """

    def __init__(self, store: Any, key: str):
        self.store, self.folder = store, f"talkmesh/resume/{key[:16]}"
        self.reused: list[str] = []
        self.reused_s = 0.0

    def step(self, name: str, make: Callable[[], Any]) -> Any:
        """The value of step ``name``: the kept one when this run made it before (its seconds added
        to :attr:`reused_s`), else ``make()``, kept before it is returned."""
        rel = f"{self.folder}/{name}.json"
        if self.store.exists(rel):
            d = json.loads(self.store.read_bytes(rel))
            self.reused.append(name)
            self.reused_s += float(d["seconds"])
            return decode(d["value"])
        t0 = time.perf_counter()
        value = make()
        self.store.write_bytes(rel, json.dumps({"seconds": time.perf_counter() - t0, "value": encode(value)}).encode())
        return value

    def clear(self) -> None:
        """Remove every kept step of this key (after the run's tables are written), and the
        ``talkmesh/resume`` folder when nothing else is in it."""
        fs, base = self.store.fs, self.store._abs(self.folder)
        if fs.exists(base):
            fs.rm(base, recursive=True)
        parent = base.rsplit("/", 1)[0]
        if fs.exists(parent) and not fs.ls(parent, detail=False):  # no other key's steps left
            fs.rm(parent, recursive=True)


__all__ = ["StepCache", "encode", "decode"]
