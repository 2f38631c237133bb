"""TalkMesh (P3) registered as an application (:mod:`tasks.registries.applications`): its command
(``harnessrl talkmesh``), its loop type (``talkmesh`` harnesses in the pipeline, with their ``mesh``
section), its report section, and its seal's verify and findings hooks. Light at import: each
hook imports what it needs when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.registries.applications import APPLICATIONS, Application
from tasks.talkmesh import publish
from tasks.talkmesh.harness_block import MeshSpec, check_mesh_harness


def _load_config(path: Path, overrides: dict[str, Any], quick: bool) -> Any:
    from tasks.talkmesh.config import load_talkmesh_config

    return load_talkmesh_config(path, overrides, quick=quick)


def _run(run_dir: str, cfg: Any, frozen: dict[str, Any]) -> dict[str, Any]:
    """:func:`tasks.talkmesh.run.run_talkmesh` with the run's policy engine (base, then with the
    trained talk adapter)."""
    from schemas import ArtifactStore
    from tasks.rollout.engines import load_policy
    from tasks.talkmesh.run import run_talkmesh

    return run_talkmesh(ArtifactStore(run_dir), cfg, frozen, lambda adapter: load_policy(cfg, adapter))


def _report_section(*args: Any) -> str:
    from tasks.talkmesh.pipeline_report import report_section

    return report_section(*args)


def _analysis_note(harnesses: list[str]) -> str:
    from tasks.talkmesh.pipeline_report import analysis_note

    return analysis_note(harnesses)


def _loop_plugin() -> Any:
    from tasks.talkmesh.plugin import PLUGIN

    return PLUGIN


TALKMESH = APPLICATIONS.register(Application(
    name="talkmesh", title="TalkMesh", paper="P3",
    help="P3 (TalkMesh): confidence head, talk-policy GRPO, the mesh against majority and confidence-weighted vote, "
         "collusion; tables, talkmesh/report.md and a plot in the run folder. A config with talkmesh.findings also "
         "gets the pre-registered findings (then: harnessrl findings).",
    config_help="a TalkMesh run config (e.g. configs/talkmesh-small.yaml)",
    set_help="override a config key, e.g. --set talkmesh.agents=4",
    takes_quick=True, load_config=_load_config, run=_run,
    loop_type="talkmesh", loop_plugin=_loop_plugin, harness_block="mesh", harness_block_model=MeshSpec,
    check_harness=check_mesh_harness, engine_tables=False,
    analysis_note=_analysis_note, report_section=_report_section,
    owns_run=publish.owns_run, verify=publish.verify, recompute_note=publish.recompute_note,
    claims_config=publish.claims_config, findings=publish.findings,
))
