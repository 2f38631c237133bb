"""MiniWoB++ suites (``suites[].source: miniwob``): web UI tasks from the ``miniwob`` package,
played in headless Chromium through :class:`tasks.environments.browser.miniwob.MiniWoBSession`.

``name`` is a comma-separated list of MiniWoB++ env names (``click-button,enter-text``) or a preset
from :data:`PRESETS`; ``size`` instances in total are dealt round-robin over the envs (instance
``i`` is env ``names[i % len(names)]``, its ``k = i // len(names)``-th instance), each with an
instance seed derived from (``seed``, env, k) (:func:`instance_seed`), so adding an env to the list
leaves the other envs' instances unchanged.

The instruction is the instance's own utterance (``Click on the "Next" button.``), read at load
time: the loader opens one browser per env and resets it to each instance seed (a MiniWoB++ page
is generated from its seed, and resets on an open page are clean; both are tested). This needs
Chromium at freeze time (~1 s per env + ~0.05 s per instance) but gives each task a meaningful,
content-addressed instruction, and lets :func:`tasks.environments.browser.miniwob.open_session` refuse a
page whose utterance no longer matches the frozen one (a changed ``miniwob`` package). The agent
sees the same utterance again in the first observation (``Task: ...``).

Grading (verifier kind ``miniwob``) is the page's own reward, read from the episode's browser:
raw reward r in [-1, 1] -> (r + 1) / 2, 0 when the task never ended (see the browser module).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

from tasks.config import SuiteConfig
from tasks.records.suites.base import Task, register_loader
from tasks.records.verifiers import GradeContext, VerifierError, register_verifier
from tasks.environments.browser import miniwob as _browser  # registers the "miniwob" browser

# Named env lists. ``basic``: five single-page tasks that scripted policies reading only the text
# rendering solve through the click/type session API (one to a few actions each): three in
# tests/environments/test_miniwob.py, all five in benchmarks/miniwob_session.py (reward 1.0 on 5 seeds each).
PRESETS: dict[str, tuple[str, ...]] = {
    "basic": ("click-button", "click-link", "enter-text", "focus-text", "click-checkboxes"),
}


def env_list(name: str) -> list[str]:
    """The env names that ``suites[].name`` stands for (a preset, or a comma-separated list).

    Raises:
        ValueError: an empty or repeated name, an unknown env, or one that is not reproducible for
            a seed (the package marks it nondeterministic, or it needs an HTTP server).
    """
    if name in PRESETS:
        return list(PRESETS[name])
    names = [n.strip() for n in name.split(",")]
    if not name.strip() or any(not n for n in names):
        raise ValueError(f"suites[].name={name!r}: expected a preset {sorted(PRESETS)} or a comma-separated list "
                         "of MiniWoB++ env names without empty entries")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"suites[].name={name!r}: env(s) {dup} listed twice")
    for n in names:
        try:
            _browser.check_env_name(n)
        except ValueError as e:
            raise ValueError(f"suites[].name={name!r}: {e}") from None
    return names


def instance_seed(seed: int, env: str, k: int) -> int:
    """The page seed of the ``k``-th instance of ``env`` in a suite with ``seed``: the first 4 bytes
    of SHA-256(``"miniwob/{seed}/{env}/{k}"``) as a big-endian int, masked to 31 bits (an int in
    [0, 2**31))."""
    digest = hashlib.sha256(f"miniwob/{seed}/{env}/{k}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@register_loader("miniwob")
def load(cfg: SuiteConfig) -> Iterator[Task]:
    """Yield ``cfg.size`` MiniWoB++ tasks (see the module docstring), grouped by env.

    Raises:
        ValueError: a bad ``name`` (see :func:`env_list`) or non-empty ``params`` (none exist).
        BrowserError: Chromium is missing or fails (the utterances are read from the pages).
    """
    if cfg.params:
        raise ValueError(f"suites[].params={dict(cfg.params)!r}: the miniwob source takes no params")
    names = env_list(cfg.name)
    for j, env in enumerate(names):
        count = len(range(j, cfg.size, len(names)))
        if count == 0:
            continue
        seeds = [instance_seed(cfg.seed, env, k) for k in range(count)]
        with _browser.MiniWoBSession(env, seeds[0]) as sess:
            for k, s in enumerate(seeds):
                if k:
                    sess.reset(s)
                yield Task(
                    task_id=f"miniwob/{env}/s{cfg.seed}/{k}",
                    suite=f"miniwob/{env}",
                    instruction=sess.utterance,
                    verifier_kind="miniwob",
                    verifier_spec={"env": env, "seed": s},
                    metadata={"env": env, "instance": k},
                    environment="browser",
                )


@register_verifier("miniwob")
def _miniwob(spec: dict[str, Any], answer: str | None, ctx: GradeContext | None) -> float:
    """The episode browser's reward (the page's raw reward r -> (r + 1) / 2; 0 if never ended).
    ``answer`` is ignored: MiniWoB++ grades what was done on the page, not a reply.

    Raises:
        VerifierError: no browser in ``ctx``, or a browser showing another instance than ``spec``.
    """
    browser = getattr(ctx, "browser", None) if ctx is not None else None
    if browser is None:
        raise VerifierError(f"miniwob verifier for {spec.get('env')!r} seed {spec.get('seed')}: no browser session "
                            "in the grading context (a browser task must be graded with its episode's browser)")
    if isinstance(browser, _browser.MiniWoBSession) and (browser.env, browser.seed) != (spec["env"], spec["seed"]):
        raise VerifierError(f"miniwob verifier: spec is {spec['env']!r} seed {spec['seed']} but the browser shows "
                            f"{browser.env!r} seed {browser.seed}")
    return float(browser.reward())
