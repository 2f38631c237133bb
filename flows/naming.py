"""What a run is called in Prefect: flow runs named from the config's name and hash, tagged with
the config's name and the paper it reproduces, so the Prefect UI's run list says which config
made which run.

- the pipeline's flow: :data:`PIPELINE_FLOW`, whether the CLI runs it (``harnessrl run``) or a
  deployment does (``harnessrl deploy``: ``harnessrl/pipeline``, ``harnessrl/freeze``, ...);
- the top-level flow run: ``<name>-<hash10>`` (:func:`run_label`, the default run folder's name),
  from its start (the flow's ``flow_run_name``, so every log line of the run says it);
- a stage subflow run: ``<stage> · <name>-<hash10>``;
- tags: the config's name and, where the name says it, the paper (:func:`paper_of`).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator

# The name of the pipeline's flow, the CLI's (flows.pipeline) and the deployments' (flows.deploy)
PIPELINE_FLOW = "harnessrl"

_PN = re.compile(r"p([1-9])(?![0-9])")


def run_label(cfg: Any) -> str:
    """``<cfg.name>-<first 10 hex digits of cfg.config_hash()>``: the name of the default run
    folder (``RUN_ROOT/NAME-CONFIGHASH``), so a flow run and its folder read the same."""
    return f"{cfg.name}-{cfg.config_hash()[:10]}"


def paper_of(name: str) -> str | None:
    """The seed paper a config name says it reproduces: ``p4-small`` -> ``P4`` (``p<n>...``),
    a name that starts with an application's name -> that application's paper
    (:func:`tasks.registries.applications.paper_of_name`: ``talkmesh-*`` -> ``P3``); None for any
    other name (``default``, ``learn-arith``)."""
    low = name.lower()
    m = _PN.match(low)
    if m:
        return f"P{m.group(1)}"
    from tasks.registries.applications import paper_of_name

    return paper_of_name(low)


def run_tags(cfg: Any) -> list[str]:
    """The tags of every flow and task run of a run of ``cfg``: its name, then its paper if any."""
    paper = paper_of(cfg.name)
    return [cfg.name] + ([paper] if paper else [])


@contextmanager
def tagged(cfg: Any) -> Iterator[None]:
    """``prefect.tags(*run_tags(cfg))``: every flow and task run created inside carries them."""
    from prefect import tags

    with tags(*run_tags(cfg)):
        yield


def flow_run_namer(stage: str | None = None) -> Callable[[], str]:
    """A ``flow_run_name`` callable for ``@flow``: Prefect calls it in the new flow run's context,
    where it reads the run's parameters: ``cfg`` (a run config) gives :func:`run_label`, else
    ``config`` (a run config's path, a deployment's parameter) the label of the config loaded from
    it (a config that does not load: its path's stem; the flow's body then fails naming the
    error), else ``label`` (a string), else the basename of ``run_dir``. With ``stage`` the name is
    ``<stage> · <label>`` (a stage subflow run), without it the label alone (the top-level run).
    Prefect renames a flow run created under another name (a deployment's run, named at random
    by the scheduler) before the run's first log line."""

    def name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters
        if params.get("cfg") is not None:
            label = run_label(params["cfg"])
        elif params.get("config"):
            from tasks.config import ConfigError, load_config

            try:
                label = run_label(load_config(str(params["config"])))
            except (ConfigError, OSError, ValueError):
                label = PurePosixPath(str(params["config"])).stem
        elif params.get("label"):
            label = str(params["label"])
        else:
            label = PurePosixPath(str(params.get("run_dir", "run")).rstrip("/")).name
        return f"{stage} · {label}" if stage else label

    name.__name__ = f"{stage or 'run'}_flow_run_name"
    return name


def label_this_run(cfg: Any) -> None:
    """Name the current flow run :func:`run_label` and add :func:`run_tags` to its tags, through
    the Prefect API: for a flow whose parameters hold a config path, not the config (a
    deployment's entry flow, which loads the config in its body). Call inside a flow run."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        raise RuntimeError("label_this_run: not inside a flow run")
    fr = ctx.flow_run
    tags = list(dict.fromkeys([*(fr.tags or []), *run_tags(cfg)]))
    with get_client(sync_client=True) as client:
        client.update_flow_run(fr.id, name=run_label(cfg), tags=tags)
    fr.name, fr.tags = run_label(cfg), tags
