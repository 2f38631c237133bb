"""A whole run's config (:class:`RunConfig`) and its loader (:func:`load_config`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from tasks.hashing import sha256_json
from tasks.yamlfile import describe, load_mapping
from tasks.config.base import ConfigError, EXECUTION_ONLY, OPTIONAL_SECTIONS, _Strict, deep_merge
from tasks.config.engines import engine_entry, online_engines
from tasks.config.records import SplitConfig, SuiteConfig
from tasks.config.policy import PACKAGED, PolicyConfig
from tasks.config.rollout import RolloutConfig, SandboxConfig
from tasks.config.train import ArmConfig, TrainConfig
from tasks.config.evaluate import EvaluateConfig
from tasks.config.analyze import AnalyzeConfig


def _sweep_points(sweep: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every combination of a ``sweep`` (dotted ``train`` key -> values), in config order, as
    ``(arm-name suffix, nested override)``: ``{"kl.beta": [0.1, 0.3]}`` gives
    ``("-kl.beta0.1", {"kl": {"beta": 0.1}})`` and ``("-kl.beta0.3", ...)``; no sweep gives one
    point ``("", {})``."""
    import itertools

    keys = list(sweep)
    out = []
    for values in itertools.product(*(sweep[k] for k in keys)):
        point: dict[str, Any] = {}
        for k, v in zip(keys, values):
            node = point
            *parents, leaf = k.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = v
        out.append(("".join(f"-{k}{v}" for k, v in zip(keys, values)), point))
    return out


class RunConfig(_Strict):
    """A whole experiment: the embedded default is ``configs/default.yaml``.

    ``arms`` (optional): several training arms from the same frozen records and rollouts, each
    with its own checkpoint (see :class:`ArmConfig`, :meth:`arm_configs`); absent, the train
    stage trains one adapter, checkpoint ``final``.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = 0
    run_root: str = "runs"
    suites: list[SuiteConfig] = Field(min_length=1)
    split: SplitConfig = Field(default_factory=SplitConfig)
    harnesses: list[str] = Field(min_length=1)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    arms: list[ArmConfig] | None = Field(default=None, min_length=1)
    sweep: dict[str, list[Any]] | None = None
    quick: dict[str, Any] | None = None
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    analyze: AnalyzeConfig = Field(default_factory=AnalyzeConfig)

    @field_validator("harnesses")
    @classmethod
    def _unique_harnesses(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"harnesses has duplicates: {v}")
        return v

    @field_validator("harnesses")
    @classmethod
    def _harnesses_load(cls, v: list[str]) -> list[str]:
        from tasks.harnesses.spec import HarnessError, load_harness

        for name in v:
            try:
                load_harness(name)
            except HarnessError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        m = self.policy.model
        if m not in PACKAGED and not (Path(m) / "config.json").is_file():
            raise ValueError(f"policy.model={m!r} is neither a packaged model {sorted(PACKAGED)} nor a folder with a "
                             "config.json")
        if self.analyze.ceiling_k > self.evaluate.attempts:
            raise ValueError(
                f"analyze.ceiling_k={self.analyze.ceiling_k} exceeds evaluate.attempts={self.evaluate.attempts}: "
                "pass@K needs at least K attempts per task"
            )
        if self.arms is not None:
            names = [a.name for a in self.arms]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"arms: duplicate arm name(s) {dup}")
        for key, values in (self.sweep or {}).items():
            if not values or len({repr(v) for v in values}) != len(values):
                raise ValueError(f"sweep[{key!r}]={values!r}: needs a non-empty list of distinct values")
        if self.evaluate.findings and not self.split.disjoint:
            raise ValueError("split.disjoint=False: a findings config (evaluate.findings) needs split.disjoint: true "
                             "(no test task may share a problem with a train task)")
        for arm, tc in self.arm_configs():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(@s[0-9]+)?", arm):
                raise ValueError(f"sweep: arm name {arm!r} (arm + swept values) is not a valid checkpoint name; sweep "
                                 "values must be numbers or simple words")
            where = "train" if self.arms is None and self.sweep is None else f"arms[{arm!r}].train"
            if tc.mode == "online" and self.rollout.task_runner in ("dask", "ray"):
                raise ValueError(f"rollout.task_runner={self.rollout.task_runner!r} with {where}.mode='online': online "
                                 "sampling uses the "
                                 "trainer's in-memory policy, which worker processes cannot load; use task_runner "
                                 "'thread' or 'serial'")
            if tc.world_size > 1 and tc.mode == "online":
                raise ValueError(f"{where}.distributed.world_size={tc.world_size} with {where}.mode='online': "
                                 "distributed online training is not built; use mode 'frozen' or world_size 1")
            if tc.distributed is not None and tc.distributed.backend == "nccl" and self.policy.device != "cuda":
                raise ValueError(f"{where}.distributed.backend='nccl' needs CUDA (policy.device: cuda); use backend "
                                 "'gloo' on the CPU")
            if tc.harnesses is not None and (not tc.harnesses or set(tc.harnesses) - set(self.harnesses)):
                raise ValueError(f"{where}.harnesses={tc.harnesses!r}: must be a non-empty subset of the training "
                                 f"harnesses {self.harnesses}")
            if tc.mode == "online" and engine_entry(self.policy.engine).online is None:
                raise ValueError(f"policy.engine={self.policy.engine!r} with {where}.mode='online': online sampling "
                                 "needs an engine the trainer can load its weights into; use policy.engine one of "
                                 f"{online_engines()}")
        from tasks.harnesses.spec import HarnessError, load_harness

        for h in self.held_out_harnesses():
            try:
                load_harness(h)
            except HarnessError as e:
                raise ValueError(f"evaluate.harnesses names {h!r}: {e}") from None
        evals = self.eval_harnesses()
        # a contrast, a finding's cell or the spread's checkpoints may name a checkpoint or an arm
        # trained under several seeds (its seed checkpoints together)
        ckpts = self.checkpoint_names() + [g for g, cks in self.arm_groups().items() if cks != [g]]
        for c in self.evaluate.contrasts or []:
            for side in ("a", "b"):
                h = getattr(c, side).harness
                if h not in evals:
                    raise ValueError(f"evaluate.contrasts[{c.name!r}].{side}.harness={h!r} is not an evaluation "
                                     f"harness {evals}")
                ck = getattr(c, side).checkpoint
                if ck not in ckpts:
                    raise ValueError(f"evaluate.contrasts[{c.name!r}].{side}.checkpoint={ck!r} is not a checkpoint "
                                     f"of this run {ckpts}")
        # a task's suite is "<source>/<name>" for reasoning-gym (other sources name theirs per task,
        # e.g. one per MiniWoB++ env): checked here where known, else when the plan is built
        suites = sorted({f"reasoning_gym/{s.name}" for s in self.suites}) \
            if all(s.source == "reasoning_gym" for s in self.suites) else None
        for kind, items in (("contrasts", self.evaluate.contrasts), ("findings", self.evaluate.findings)):
            for it in items or []:
                if suites is not None and it.suite is not None and it.suite not in suites:
                    raise ValueError(f"evaluate.{kind}[{it.name!r}].suite={it.suite!r} is not a suite of this run {suites}")
                for i, cell in enumerate(getattr(it, "cells", None) or []):
                    if suites is not None and cell.suite is not None and cell.suite not in suites:
                        raise ValueError(f"evaluate.findings[{it.name!r}].cells[{i}].suite={cell.suite!r} is not a suite "
                                         f"of this run {suites}")
        for f in self.evaluate.findings or []:
            for ck in f.checkpoints or []:
                if ck not in ckpts:
                    raise ValueError(f"evaluate.findings[{f.name!r}].checkpoints names {ck!r}, not a checkpoint of this "
                                     f"run {ckpts}")
            for field in ("cells", "a_cells", "b_cells"):
                for cell in getattr(f, field) or []:
                    if cell.checkpoint not in ckpts or cell.harness not in evals:
                        raise ValueError(f"evaluate.findings[{f.name!r}].{field}: ({cell.checkpoint!r}, {cell.harness!r}) "
                                         f"is not an evaluated (checkpoint, harness): checkpoints {ckpts}, harnesses {evals}")
        if self.analyze.reference not in ckpts:
            raise ValueError(f"analyze.reference={self.analyze.reference!r} is not a checkpoint of this run {ckpts}")
        for ck in self.analyze.branching.checkpoints:
            if ck not in ckpts:
                raise ValueError(f"analyze.branching.checkpoints names {ck!r}, not a checkpoint of this run {ckpts}")
        return self

    def arm_configs(self) -> list[tuple[str, TrainConfig]]:
        """The training arms as ``(checkpoint name, effective TrainConfig)``, in config order.

        Without ``arms``: ``[("final", self.train)]``. With ``arms``: one per arm, its ``train``
        overrides deep-merged (:func:`deep_merge`) onto the top-level ``train`` section. An arm
        whose effective section sets ``seeds`` is trained once per seed, as the checkpoint
        ``<arm>@s<seed>`` with ``seed`` set to that seed (and ``seeds`` unset), in the list's order.

        Raises:
            ValueError: an arm's merged section is not a valid TrainConfig; the message names
                ``arms['<name>'].train.<key>``, the value and the reason.
        """
        return [(ck, tc) for _, ck, tc in self._arm_seeds()]

    def arm_groups(self) -> dict[str, list[str]]:
        """Each training arm's name -> the names of its checkpoints, in config order: ``[<arm>]``
        for an arm trained once, ``[<arm>@s<seed>, ...]`` for one trained under ``seeds``."""
        out: dict[str, list[str]] = {}
        for group, ck, _ in self._arm_seeds():
            out.setdefault(group, []).append(ck)
        return out

    def _arm_seeds(self) -> list[tuple[str, str, TrainConfig]]:
        """``(arm, checkpoint name, effective TrainConfig)`` per trained checkpoint (see
        :meth:`arm_configs`)."""
        out = []
        for name, tc in self._arm_sections():
            if tc.seeds is None:
                out.append((name, name, tc))
            else:
                out += [(name, f"{name}@s{s}", tc.model_copy(update={"seed": s, "seeds": None})) for s in tc.seeds]
        return out

    def _arm_sections(self) -> list[tuple[str, TrainConfig]]:
        """Each arm's name and merged ``train`` section, before the seeds are expanded."""
        if self.arms is None and self.sweep is None:
            return [("final", self.train)]
        base = self.train.model_dump(mode="python")
        arms = [(a.name, a.train, a.sweep) for a in self.arms] if self.arms is not None else [("final", {}, True)]
        out = []
        for name, over, swept in arms:
            for suffix, point in _sweep_points(self.sweep or {} if swept else {}):
                merged = deep_merge(deep_merge(base, point), over)
                try:
                    out.append((name + suffix, TrainConfig.model_validate(merged)))
                except ValidationError as e:
                    msgs = []
                    for err in e.errors():
                        key = ".".join(str(x) for x in err["loc"])
                        where = f"arms[{name + suffix!r}].train" + (f".{key}={err['input']!r}" if key else "")
                        msgs.append(f"{where}: {err['msg']}")
                    raise ValueError("; ".join(msgs)) from None
        return out

    def checkpoint_names(self) -> list[str]:
        """Names of the checkpoints the train stage writes: ``base`` then each arm (``final``
        without ``arms``)."""
        return ["base", *(name for name, _ in self.arm_configs())]

    def eval_harnesses(self) -> list[str]:
        """The evaluation harnesses: ``evaluate.harnesses``, else the training ``harnesses``."""
        return list(self.evaluate.harnesses or self.harnesses)

    def held_out_harnesses(self) -> list[str]:
        """Evaluation harnesses never used in training (held-out columns), in config order."""
        return [h for h in self.evaluate.harnesses or [] if h not in self.harnesses]

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of the whole config (an absent optional section, ``arms`` =
        None, left out, so configs without it keep their hash)."""
        dump = self.model_dump(mode="json")
        if dump["train"].get("distributed") is None:  # added later: configs without it keep their hash
            dump["train"].pop("distributed", None)
        return sha256_json({k: v for k, v in dump.items() if not (k in OPTIONAL_SECTIONS and v is None)})

    def section_hash(self, *sections: str) -> str:
        """SHA-256 of the named top-level sections (plus ``seed``): a stage's config cache key.
        An absent optional section (``arms`` = None) is left out, as if not named."""
        dump = self.model_dump(mode="json", exclude=EXECUTION_ONLY)
        return sha256_json({"seed": self.seed, **{s: dump[s] for s in sections
                                                   if not (s in OPTIONAL_SECTIONS and dump[s] is None)}})


def _apply_override(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """Set ``dotted`` (``train.steps``, ``suites.0.size``: a number indexes a list) in ``data``.

    Raises:
        ConfigError: a parent is neither a mapping nor a list, or a list index is out of range.
    """
    node: Any = data
    *parents, leaf = dotted.split(".")
    for i, k in enumerate(parents + [leaf]):
        last = i == len(parents)
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                raise ConfigError(f"{where}: override {dotted}={value!r}: {'.'.join((parents + [leaf])[:i + 1])!r} "
                                  f"is not an index of a list of {len(node)}")
            if last:
                node[int(k)] = value
            else:
                node = node[int(k)]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: override {dotted}={value!r}: key {'.'.join(parents[:i])!r} is {node!r}, not "
                              "a mapping")
        if last:
            node[k] = value
        else:
            node = node.setdefault(k, {})


def load_config(path: str | Path, overrides: dict[str, Any] | None = None,
                model: type[RunConfig] | None = None, *, quick: bool = False) -> RunConfig:
    """Load and validate a run config from YAML.

    ``overrides`` maps dotted keys (``"train.steps"``, ``"suites.0.size"``: a number indexes a
    list) to values applied before validation. ``quick``: first apply the config's own ``quick``
    section (dotted keys to values, e.g. fewer tasks and steps: ``harnessrl run --quick``), then
    ``overrides``. ``model``: the config class to validate with (default :class:`RunConfig`; a
    subclass such as BiPA's ``BipaRunConfig`` for commands that need more sections).

    Raises:
        ConfigError: the file is missing, is not YAML, is not a mapping, or fails validation;
            ``quick`` without a ``quick`` section; the message names the file, the key path and
            the offending value.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file does not exist")
    data = load_mapping(p, ConfigError)
    sources: dict[str, str] = {}  # dotted key -> where its value came from, for the error messages
    if quick:
        q = data.get("quick")
        if not isinstance(q, dict) or not q:
            raise ConfigError(f"{p}: --quick needs a 'quick' section (dotted keys -> values), got {q!r}")
        for dotted, value in q.items():
            _apply_override(data, str(dotted), value, f"{p} (quick)")
            sources[str(dotted)] = f"{p} (quick)"
    for dotted, value in (overrides or {}).items():
        _apply_override(data, dotted, value, "--set")
        sources[dotted] = "--set"
    try:
        return (model or RunConfig).model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(p, e, sources)) from None
