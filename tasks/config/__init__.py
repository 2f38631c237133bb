"""Experiment configuration: pydantic models loaded from YAML.

A config names everything a run depends on; its hash (:meth:`RunConfig.config_hash`) is part of
every stage's cache key. Unknown keys are refused (``extra="forbid"``) so a typo never silently
falls back to a default. Invalid combinations are refused at load time, not halfway through a run.

One module per section, beside what it configures: ``records`` (suites, split), ``policy``,
``rollout`` (sandbox, rollout), ``train`` (train, lora, kl, distributed, arms), ``evaluate``,
``analyze``; ``run`` holds :class:`RunConfig` and the one loader, :func:`load_config`. Every
public name is importable from ``tasks.config``.
"""

from tasks.config.analyze import AnalyzeConfig, BranchingConfig, LeakageConfig, LogOddsConfig
from tasks.config.base import EXECUTION_ONLY, OPTIONAL_SECTIONS, STAGES, ConfigError, deep_merge
from tasks.config.evaluate import ContrastArm, ContrastConfig, EvaluateConfig, P1Cell
from tasks.config.policy import OpenAIEngineConfig, PolicyConfig, VLLMEngineConfig
from tasks.config.records import SplitConfig, SuiteConfig
from tasks.config.rollout import RolloutConfig, SandboxConfig
from tasks.config.run import RunConfig, load_config
from tasks.config.train import ArmConfig, DistributedConfig, KLConfig, LoraConfig, TrainConfig

__all__ = ["AnalyzeConfig", "ArmConfig", "BranchingConfig", "ConfigError", "ContrastArm", "ContrastConfig",
           "DistributedConfig", "EXECUTION_ONLY", "EvaluateConfig", "KLConfig", "LeakageConfig", "LogOddsConfig",
           "LoraConfig", "OPTIONAL_SECTIONS", "OpenAIEngineConfig", "P1Cell", "PolicyConfig", "RolloutConfig", "RunConfig",
           "STAGES", "SandboxConfig", "SplitConfig", "SuiteConfig", "TrainConfig", "VLLMEngineConfig", "deep_merge",
           "load_config"]
