"""Verifiers: grade a finished episode against the task's hidden verifier spec.

Called only after the agent has finished; the spec (reference answer, hidden tests) never
enters the agent's context. Each suite registers the verifier kinds it uses with
:func:`register_verifier`; a verifier gets the spec, the submitted answer and a
:class:`GradeContext` that gives it the episode's sandbox (in the state the agent left it, for
verifiers that copy hidden tests in and run them) or browser session.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from tasks.environments.browser import BrowserSession
    from tasks.environments.sandbox import Sandbox


class VerifierError(RuntimeError):
    """The verifier itself could not grade (an infrastructure error, not a wrong answer)."""


class GradeContext(Protocol):
    """What a verifier may touch once the agent has finished.

    ``sandbox()`` returns the episode's sandbox (created, and the task's workspace set up, on first
    use); ``browser`` is the episode's browser session for ``browser`` tasks, else None.
    """

    browser: "BrowserSession | None"

    def sandbox(self) -> "Sandbox": ...


# (spec, answer, ctx) -> reward in [0, 1]; answer None = the agent submitted nothing.
Verifier = Callable[[dict[str, Any], "str | None", "GradeContext | None"], float]
_VERIFIERS: dict[str, Verifier] = {}


def register_verifier(kind: str) -> Callable[[Verifier], Verifier]:
    """Register ``fn(spec, answer, ctx) -> reward in [0, 1]`` for ``verifier_kind == kind``."""

    def deco(fn: Verifier) -> Verifier:
        _VERIFIERS[kind] = fn
        return fn

    return deco


def grade(verifier_kind: str, verifier_spec: str | dict[str, Any], answer: str | None,
          ctx: GradeContext | None = None) -> float:
    """Reward in [0, 1] for a finished episode.

    Raises:
        VerifierError: unknown verifier kind; a verifier that needs a sandbox or browser called
            without one; a spec whose regenerated task no longer matches (the suite package
            changed version); the sandbox failing while the hidden tests ran.
    """
    from tasks.records.suites.base import import_suite_modules

    import_suite_modules()
    spec = json.loads(verifier_spec) if isinstance(verifier_spec, str) else verifier_spec
    fn = _VERIFIERS.get(verifier_kind)
    if fn is None:
        raise VerifierError(f"unknown verifier kind {verifier_kind!r}; known: {sorted(_VERIFIERS)}")
    r = float(fn(spec, answer, ctx))
    if not (0.0 <= r <= 1.0):
        raise VerifierError(f"verifier {verifier_kind!r} returned reward {r}, outside [0, 1]")
    return r


def score(verifier_kind: str, verifier_spec: str | dict[str, Any], answer: str | None) -> float:
    """:func:`grade` for verifiers that need only the answer (no sandbox, no browser)."""
    return grade(verifier_kind, verifier_spec, answer, None)


@register_verifier("reasoning_gym")
def _reasoning_gym(spec: dict[str, Any], answer: str | None, ctx: GradeContext | None) -> float:
    """Regenerate the reasoning-gym entry from its seed and call the dataset's ``score_answer``."""
    from tasks.records.suites.reasoning_gym import dataset_entry

    ds, entry = dataset_entry(spec)
    if str(entry["answer"]) != spec["answer"]:
        raise VerifierError(
            f"reasoning-gym {spec['dataset']} seed {spec['seed']} index {spec['index']} regenerated answer "
            f"{entry['answer']!r} != frozen {spec['answer']!r}: the reasoning-gym version changed"
        )
    if answer is None:
        return 0.0
    if spec.get("reward") == "exact":
        return exact_answer_reward(answer, spec["answer"])
    return min(1.0, max(0.0, float(ds.score_answer(answer, entry))))


def _number(text: str) -> float | None:
    t = text.strip().rstrip(".").replace(",", "").strip()
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def exact_answer_reward(answer: str, reference: str) -> float:
    """1.0 iff ``answer`` equals ``reference``, else 0.0: no partial credit.

    Two numbers are compared as numbers (``"3.0"`` equals ``"3"``, ``"1,000"`` equals ``"1000"``;
    a relative tolerance of 1e-9 absorbs float formatting); anything else is compared as text,
    stripped and case-folded. Unlike reasoning-gym's ``score_answer``, which gives 0.5 when the
    reference is a substring of the answer (``"-2"`` for ``"2"``, ``"12"`` for ``"2"``), a sign
    error or an extra digit scores 0, so the training reward is the sealed evaluation's success.
    """
    a, r = _number(answer), _number(reference)
    if a is not None and r is not None:
        return 1.0 if math.isclose(a, r, rel_tol=1e-9, abs_tol=1e-12) else 0.0
    return 1.0 if answer.strip().casefold() == reference.strip().casefold() else 0.0


# ----------------------------------------------------------------------------------------------
# the P6 reward rule (P6: docs/methods/p6-gspo-lora.md), shared by the suites that carry per-test lists

REWARD_RULES = ("fraction", "p6")


def entry_passed(entry: str, tests: dict[str, bool]) -> bool:
    """Whether the list entry ``entry`` passed in a test run ``tests`` ({test id: passed}).

    An entry names one test id exactly, or a test function whose parametrized instances are ids
    ``entry + "[...]"``: it passes when at least one id matches and every matching id passed; an
    entry with no matching id (its file failed to import, the run timed out) did not pass.
    """
    hits = [ok for tid, ok in tests.items() if tid == entry or tid.startswith(entry + "[")]
    return bool(hits) and all(hits)


def p6_reward(fail_to_pass: list[str], pass_to_pass: list[str], tests: dict[str, bool]) -> float:
    """P6's reward: passed fail-to-pass tests / ``len(fail_to_pass)``, forced to 0.0 when any
    pass-to-pass test does not pass (Mehta et al., arXiv 2610.00890, as summarized in docs/methods/p6-gspo-lora.md).

    ``tests``: {test id: passed} of the grading run; entries match ids by
    :func:`entry_passed`. With an empty ``fail_to_pass`` (every hidden test already passed on
    the untouched workspace) the reward is 1.0 iff every pass-to-pass test still passes. Returns a
    float in [0, 1].

    Raises:
        VerifierError: both lists empty (nothing to grade by).
    """
    if not fail_to_pass and not pass_to_pass:
        raise VerifierError("reward p6: the task has neither fail-to-pass nor pass-to-pass tests")
    if not all(entry_passed(e, tests) for e in pass_to_pass):
        return 0.0
    if not fail_to_pass:
        return 1.0
    return sum(entry_passed(e, tests) for e in fail_to_pass) / len(fail_to_pass)
