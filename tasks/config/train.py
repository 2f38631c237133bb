"""The train stage's sections: ``train`` (with ``lora``, ``kl``, ``distributed``) and ``arms``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tasks.config.base import LaterOptions, _Strict
from tasks.registries import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, OneOf

#: policy tokens per chunk of the output projection when ``train.logprob_chunk_tokens`` is unset
DEFAULT_LOGPROB_CHUNK_TOKENS = 256
#: padded tokens (rows x longest row) per micro-batch when ``train.micro_batch_tokens`` is unset
DEFAULT_MICRO_BATCH_TOKENS = 1536
#: padded tokens above which a micro-batch without a shared prompt checkpoints its decoder layers
#: when ``train.checkpoint_above_tokens`` is unset
DEFAULT_CHECKPOINT_ABOVE_TOKENS = 512


class LoraConfig(_Strict):
    """LoRA adapter (peft): rank ``r``, scaling ``alpha``, the module names to adapt."""

    r: int = Field(default=8, gt=0)
    alpha: int = Field(default=16, gt=0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class KLConfig(_Strict):
    """KL regularisation towards the reference policy (P5: docs/methods/p5-kl.md).

    ``estimator`` k1/k2/k3 (Schulman's estimators) or another of
    ``tasks.registries.KL_ESTIMATORS``, ``placement`` ``reward`` (detached, summed over
    the sequence and subtracted from the reward before advantages) or ``loss`` (beta * mean k added
    to the loss) or ``both``; ``beta`` = 0 disables it. ``importance_weighted`` multiplies the
    in-loss estimate by the sequence ratio pi_theta / pi_old (P5's ``rho * k3`` for stale samples).
    """

    estimator: Annotated[str, OneOf(KL_ESTIMATORS)] = "k1"
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
    ``RANK`` / ``WORLD_SIZE`` environment). ``fsdp``: shard the frozen base weights over the
    processes (torch FSDP2, one unit per decoder layer) instead of replicating them (DDP), for a
    base model that does not fit one device; the LoRA adapter stays replicated and its gradients
    are averaged as under DDP (:func:`tasks.train.distributed.shard_base_weights`). How a stage
    runs, not what it computes: left out of the cache keys (results agree with one process to
    float rounding).
    """

    backend: Literal["gloo", "nccl"] = "gloo"
    world_size: int = Field(default=1, ge=1)
    fsdp: bool = False

    @model_validator(mode="after")
    def _check(self) -> "DistributedConfig":
        if self.fsdp and self.world_size < 2:
            raise ValueError(f"train.distributed.fsdp: sharding over world_size={self.world_size} process shards "
                             "nothing; set world_size >= 2 or fsdp: false")
        return self


class TrainConfig(LaterOptions):
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
    the running engine after every batch and a fixed probe is scored by both (eval mode); a max
    |log-prob difference| (nats), or a difference between how far each side's probe moved since
    the last sync, above this stops the run (:mod:`tasks.train.online`). Unset: by precision,
    :func:`tasks.train.online.sync_tolerance` (1e-3 with float32 on both sides, 0.5 otherwise).
    Episodes: infrastructure errors never train; ``drop_stop_reasons`` drops others on purpose;
    ``truncated_reward``: an episode that timed out or was cut at its token budget scores ``zero``
    in its group (default) or keeps its ``graded`` reward.
    ``init_adapter``: a peft adapter folder to start from (else a fresh adapter, LoRA B = 0).
    ``seed``: the training seed (the adapter's initial weights, the mini-batch order, the control's
    rewards, online sampling; None: the run's ``seed``); ``seeds``: train once per listed seed,
    each its own checkpoint ``<arm>@s<seed>`` (:meth:`tasks.config.RunConfig.arm_configs`), so a
    recipe comparison carries the variance between training runs (docs/experiments/findings-rules.md).
    Set at the top level, ``seeds`` applies to every arm; ``arms[].train.seeds`` sets one arm's.
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
    Memory (docs/concepts.md, "Training memory"): a forward pass takes one *micro-batch* of sequences at
    a time (gradients accumulate over a mini-batch's micro-batches with its global denominators,
    so the update does not depend on the grouping). A micro-batch holds at most
    ``micro_batch_size`` sequences and at most ``micro_batch_tokens`` padded tokens (rows x
    longest row; unset: 1,536); a longer sequence trains alone. ``logprob_chunk_tokens``: the
    output projection to the vocabulary, the sampler's processing and the entropy run on this
    many policy tokens at a time and are recomputed chunk by chunk in the backward pass (unset:
    256; 0: the whole micro-batch at once, the unchunked path, for comparison). Both change
    float rounding only, and are left out of the dumps when unset (configs written before them
    keep their hashes).
    ``checkpoint_above_tokens``: a training forward whose micro-batch does not take the
    shared-prompt path (``share_prompt`` off, or no prompt repeats in it: a long sequence that
    trains alone) and holds more than this many padded tokens runs with its decoder layers
    checkpointed (activations recomputed in the backward pass; the same values and gradients);
    unset: 512; 0: never. Shared-prompt forwards are never checkpointed (their prompt's key/value
    cache is not recomputable), so it combines with ``share_prompt``; their size is bounded by
    ``micro_batch_tokens``. Under FSDP the choice is off (checkpoint with
    ``gradient_checkpointing``). Left out of the dumps when unset, like the two above.
    """

    _later: ClassVar[tuple[str, ...]] = ("micro_batch_tokens", "logprob_chunk_tokens", "checkpoint_above_tokens",
                                         "seed", "seeds")

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
    micro_batch_tokens: int | None = Field(default=None, gt=0)
    logprob_chunk_tokens: int | None = Field(default=None, ge=0)
    checkpoint_above_tokens: int | None = Field(default=None, ge=0)
    grouping: Literal["within", "cross", "cross_coverage_matched", "cross_residualized"] = "within"
    advantage_scale: Annotated[str, OneOf(ADVANTAGE_ESTIMATORS)] = "std"
    # The random-reward control (a learning claim's baseline): the same pipeline, trained on rewards
    # that carry no information, shuffled across each batch or drawn at its success rate
    # (tasks.train.advantages.control_rewards); the logged rewards stay the real ones.
    reward_control: Literal["none", "shuffle", "bernoulli"] = "none"
    # Train under these training harnesses only (None: every one in `harnesses`): an arm per harness
    # is one of P1's (harness, task) cells, its gain measured under the harness it trained in.
    harnesses: list[str] | None = None
    clip_low: float = Field(default=0.2, gt=0)
    clip_high: float = Field(default=0.2, gt=0)
    agg: Annotated[str, OneOf(LOSS_AGGREGATIONS)] = "token_mean"
    max_len: int | None = Field(default=None, gt=0)
    max_staleness: int = Field(default=0, ge=0)
    old_logprobs: Literal["recompute", "sampler"] | None = None
    tis_cap: float | None = Field(default=None, gt=0)
    sync_tolerance: float | None = Field(default=None, gt=0)
    drop_stop_reasons: list[Literal["timeout", "max_tokens", "format_error", "max_turns", "submitted"]] = \
        Field(default_factory=list)
    truncated_reward: Literal["zero", "graded"] = "zero"
    reference: Literal["initial", "base"] = "initial"
    init_adapter: str | None = None
    # The training seed: the seed of everything the train stage draws for this arm (the adapter's
    # initial weights, the mini-batch order, the control's rewards, online sampling); None: the
    # run's `seed`. The frozen rollouts, the split and the sealed evaluation keep the run's seeds.
    seed: int | None = Field(default=None, ge=0)
    # Train each arm once per training seed in this list, as its own checkpoint `<arm>@s<seed>`
    # (RunConfig.arm_configs); a contrast or finding naming the arm is estimated over its seeds
    # and the tasks (docs/experiments/findings-rules.md). None: one checkpoint `<arm>`, trained
    # with `seed` (or the run's).
    seeds: list[int] | None = None
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
    def micro_tokens(self) -> int:
        """Padded tokens a micro-batch may hold: ``micro_batch_tokens``, else 1,536."""
        return self.micro_batch_tokens if self.micro_batch_tokens is not None else DEFAULT_MICRO_BATCH_TOKENS

    @property
    def chunk_tokens(self) -> int:
        """Policy tokens per chunk of the output projection: ``logprob_chunk_tokens``, else 256
        (0: unchunked)."""
        n = self.logprob_chunk_tokens
        return n if n is not None else DEFAULT_LOGPROB_CHUNK_TOKENS

    @property
    def checkpoint_tokens(self) -> int:
        """Padded tokens above which an unshared training forward is checkpointed:
        ``checkpoint_above_tokens``, else 512 (0: never)."""
        n = self.checkpoint_above_tokens
        return n if n is not None else DEFAULT_CHECKPOINT_ABOVE_TOKENS

    @property
    def old_source(self) -> str:
        """Where the old log-probs come from: ``old_logprobs``, else the mode's default."""
        return self.old_logprobs or ("recompute" if self.mode == "frozen" else "sampler")

    @property
    def num_epochs(self) -> int:
        """Passes over the frozen rollouts (1 unless ``epochs`` is set; frozen mode only)."""
        return self.epochs or 1

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or len(set(v)) != len(v) or min(v) < 0):
            raise ValueError(f"train.seeds={v}: needs a non-empty list of distinct training seeds >= 0")
        return v

    @model_validator(mode="after")
    def _check_combination(self) -> "TrainConfig":
        if self.seed is not None and self.seeds is not None:
            raise ValueError(f"train.seed={self.seed} with train.seeds={self.seeds}: seed is one training seed, seeds "
                             "trains one checkpoint per seed; set one of them")
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
        if LOSS_AGGREGATIONS.get(self.agg).needs_max_len and self.max_len is None:
            raise ValueError(f"train.agg={self.agg!r} ({LOSS_AGGREGATIONS.get(self.agg).source}) needs train.max_len, "
                             "the constant normaliser")
        return self


class ArmConfig(_Strict):
    """One training arm (docs/methods/p4-within-cross.md, docs/methods/p5-kl.md): trained from the
    same frozen records and rollouts as every other arm, with its own checkpoint
    ``train/checkpoints/<name>/step-<steps>``.

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
