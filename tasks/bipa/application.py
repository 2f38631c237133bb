"""BiPA (P2) registered as an application (:mod:`tasks.registries.applications`): its command
(``harnessrl bipa``). It has no loop type of its own (it rewrites a harness's skill and runs the
engine's loop types). A config with ``bipa.findings`` runs the sealed, pre-registered measurement
(:mod:`tasks.bipa.sealed_run`), which ``harnessrl verify`` recomputes and ``harnessrl findings``
publishes (:mod:`tasks.bipa.publish`). Light at import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.bipa import publish
from tasks.registries.applications import APPLICATIONS, Application


def _load_config(path: Path, overrides: dict[str, Any], quick: bool) -> Any:
    from tasks.bipa.config import load_bipa_config

    return load_bipa_config(path, overrides, quick=quick)


def _run(run_dir: str, cfg: Any, frozen: dict[str, Any]) -> dict[str, Any]:
    """Load the policy (and the proposer, when ``bipa.proposer`` names another engine), run
    :func:`tasks.bipa.sealed_run.run_sealed` (a config with ``bipa.findings``) or
    :func:`tasks.bipa.optimizer.run_bipa`, and close the engines."""
    from schemas import ArtifactStore
    from tasks.bipa.optimizer import run_bipa
    from tasks.bipa.sealed_run import run_sealed
    from tasks.rollout.engines import close_policy, load_policy

    policy = load_policy(cfg)
    proposer = None
    try:
        if cfg.bipa.proposer is not None:
            proposer = load_policy(cfg.model_copy(update={"policy": cfg.bipa.proposer}))
        run = run_sealed if cfg.bipa.findings is not None else run_bipa
        return run(ArtifactStore(run_dir), cfg, frozen, policy, proposer)
    finally:
        close_policy(policy)
        if proposer is not None:
            close_policy(proposer)


BIPA = APPLICATIONS.register(Application(
    name="bipa", title="BiPA", paper="P2",
    help="P2 (BiPA): optimise a harness's skill, replay the acceptance rule on fresh and test episodes, build the "
         "episode graph; artifacts and bipa/report.md in the run folder.",
    config_help="a BiPA run config (e.g. configs/bipa-small.yaml)",
    set_help="override a config key, e.g. --set bipa.candidates=2",
    takes_quick=True, load_config=_load_config, run=_run,
    owns_run=publish.owns_run, verify=publish.verify, recompute_note=publish.recompute_note,
    claims_config=publish.claims_config, findings=publish.findings,
))
