"""Verifiers: grade a finished episode's answer against the task's hidden verifier spec.

Called only after the agent has finished; the spec (reference answer, hidden tests) never
enters the agent's context.
"""

from __future__ import annotations

import json
from typing import Any


class VerifierError(RuntimeError):
    """The verifier itself could not grade (an infrastructure error, not a wrong answer)."""


def score(verifier_kind: str, verifier_spec: str | dict[str, Any], answer: str | None) -> float:
    """Reward in [0, 1] for ``answer`` (``None`` = no answer given, reward 0).

    Raises:
        VerifierError: unknown verifier kind, or a spec whose regenerated task no longer matches
            (e.g. the suite package changed version).
    """
    spec = json.loads(verifier_spec) if isinstance(verifier_spec, str) else verifier_spec
    if verifier_kind == "reasoning_gym":
        from tasks.records.suites.reasoning_gym import dataset_entry

        ds, entry = dataset_entry(spec)
        if str(entry["answer"]) != spec["answer"]:
            raise VerifierError(
                f"reasoning-gym {spec['dataset']} seed {spec['seed']} index {spec['index']} regenerated answer "
                f"{entry['answer']!r} != frozen {spec['answer']!r}: the reasoning-gym version changed"
            )
        if answer is None:
            return 0.0
        r = float(ds.score_answer(answer, entry))
        return min(1.0, max(0.0, r))
    raise VerifierError(f"unknown verifier kind {verifier_kind!r}")
