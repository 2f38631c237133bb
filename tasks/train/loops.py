"""The training loops: frozen (epochs over fixed rollouts) and online (sampling with the current
policy, optionally ahead of the trainer by a bounded number of policy versions).

Both schedule mini-batches of whole groups (:func:`tasks.train.batches.minibatches`), seeded per
pass from the config seed, and call :meth:`tasks.train.trainer.Trainer.step` once per mini-batch.
Both save a resumable state (adapter, AdamW state, every random stream a step draws, step, the
batch's old log-probs, metric rows) every ``train.checkpoint_every`` steps; a resumed frozen run,
or online run with ``max_staleness: 0``, ends bit-identical to an uninterrupted one, with LoRA
dropout too (the random streams are put back after the resumed epoch's batch is rebuilt).

Inside a torch.distributed process group (:mod:`tasks.train.distributed`) every rank runs the
same loop on the same data and trains its share of each mini-batch; only rank 0 logs, calls
``after_step``, writes the resumable state and saves the adapter; every rank resumes from the
state file (on a shared file system across hosts).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from tasks.config import RunConfig
from tasks.hashing import seed_from
from tasks.train.batches import minibatches
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import Batch, Trainer, TrainingInterrupted


@dataclass
class TrainResult:
    """``steps``: rows of the ``train_steps`` artifact (deterministic); ``timing``: per step
    ``{"step", "seconds", "tokens_per_s"}`` (wall clock); ``phases``: per online iteration
    ``{"iteration", "iter_s", "sample_s", "wait_s", "sync_s", "train_s", "sync_max_abs_logp_diff",
    "sync_bytes"}`` (bytes the sync sent to the engine; 0 without one)
    (seconds: the whole iteration, generating its batch (on the sampler's thread, possibly while
    the previous batch trained), waiting for it, training, loading the weights into the engine);
    ``adapter_dir``: the saved adapter."""

    steps: list[dict[str, Any]]
    timing: list[dict[str, float]]
    adapter_dir: Path
    phases: list[dict[str, float]] = field(default_factory=list)


def _save_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically write a resumable training state (temp file + rename)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _resume(state_path: Path | None, resume_key: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    import torch

    if state_path is None or not state_path.is_file():
        return None
    st = torch.load(state_path, weights_only=False)
    if st.get("resume_key") != resume_key:
        return None
    log(f"train: resuming after step {st['version']} from {state_path}")
    return st


def frozen_schedule(cfg: RunConfig, groups: list[list[int]]) -> list[tuple[int, int, int, list[int]]]:
    """Every optimizer step of a frozen run, in order: ``(epoch, ppo_epoch, batch_index,
    sequence indices)``. Per epoch and PPO epoch the groups are shuffled with
    ``seed_from(cfg.seed, "minibatch", epoch, ppo_epoch)``; each mini-batch holds
    ``train.batch_size`` whole groups, so an epoch is ``ppo_epochs * ceil(N / batch_size)`` steps."""
    tc = cfg.train
    out = []
    for epoch in range(tc.num_epochs):
        for ppo in range(tc.ppo_epochs):
            for b, idx in enumerate(minibatches(groups, tc.batch_size, seed_from(cfg.seed, "minibatch", epoch, ppo))):
                out.append((epoch, ppo, b, idx))
    return out


def train(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
          log: Callable[[str], None] = print, *, dropped: dict[str, int] | None = None,
          state_path: Path | None = None, resume_key: str = "", stop_after: int | None = None,
          after_step: Callable[[Trainer, dict[str, Any]], None] | None = None) -> TrainResult:
    """Frozen mode: ``train.epochs`` passes over ``seqs`` in mini-batches of ``train.batch_size``
    whole groups (:func:`frozen_schedule`), then save the adapter to ``out_dir``.

    The old log-probs are fixed when each epoch starts (``train.old_logprobs``: recomputed with
    the policy of that moment, or the sampler's), so the later mini-batches of an epoch are
    off-policy and the clip range acts.

    Args:
        dropped: the episodes :func:`tasks.train.sequences.build_sequences` left out, by rule
            (logged in every step's row).
        state_path: file for the resumable state, rewritten every ``train.checkpoint_every``
            steps. When it holds a state with the same ``resume_key``, training resumes after its
            step (with the old log-probs of that epoch) and ends bit-identical to an uninterrupted
            run; a state that already holds every step only saves its adapter.
        stop_after: raise :class:`TrainingInterrupted` after this many steps of this call.
        after_step: called with the trainer and the row after every step (e.g. snapshots); on
            rank 0 only under several processes.

    Under a torch.distributed process group of N > 1 processes (``train.distributed``; started
    by :func:`train_distributed` or ``torchrun``) every rank calls this with the same arguments;
    rank 0 returns the result and writes ``out_dir`` and ``state_path``, the others return the
    same rows without writing anything.

    Raises:
        ValueError: no sequences, or no policy-generated token among them.
        FloatingPointError: a non-finite gradient norm.
    """
    from tasks.progress import progress

    from tasks.train.distributed import barrier, context

    tc = cfg.train
    main = context().is_main
    log = log if main else _silent
    trainer = Trainer(cfg, model_dir, log)
    if not seqs:
        raise ValueError("train: no usable episodes (all were infra errors, dropped, or there were none)")
    from tasks.train.batches import plan_groups

    groups = plan_groups([s.reward for s in seqs], [s.task_id for s in seqs], [s.harness_id for s in seqs],
                         tc.grouping, scale=tc.advantage_scale).groups
    schedule = frozen_schedule(cfg, groups)
    total = len(schedule)
    per_epoch = total // tc.num_epochs
    log(f"train: {len(seqs)} sequences in {len(groups)} groups, {tc.num_epochs} epoch(s) x {per_epoch} optimizer "
        f"steps (batch_size {tc.batch_size or len(groups)} groups, ppo_epochs {tc.ppo_epochs})")
    st = _resume(state_path, resume_key, log)
    rows: list[dict[str, Any]] = []
    timing: list[dict[str, float]] = []
    batch: Batch | None = None
    if st is not None:
        trainer.load(st)
        rows, timing = st["rows"], st["timing"]
        if st.get("old") is not None and trainer.version < total:
            batch = trainer.new_batch(seqs, epoch=st["epoch"], dropped=dropped,
                                      layout_seed=seed_from(cfg.seed, "minibatch", st["epoch"], 0))
            batch.old, batch.old_version, batch.mismatch = st["old"], st["old_version"], st["mismatch"]
            batch.deferred, batch.ref_deferred = set(), False  # the state's old log-probs are complete
        # rebuilding the batch ran no-grad passes, which draw dropout masks (lora.dropout > 0): the
        # random streams go back to where the saved run stood after its step
        trainer.restore_rng(st)
    barrier(trainer.dist)  # every rank has read the state before rank 0 may rewrite it
    done_here = 0
    with progress("train steps", total - trainer.version, "steps") as advance:
        for n, (epoch, ppo, b_idx, idx) in enumerate(schedule, start=1):
            if n <= trainer.version:
                continue
            if batch is None or batch.epoch != epoch:
                batch = trainer.new_batch(seqs, epoch=epoch, dropped=dropped,
                                          ref_cache=batch.ref if batch is not None else None,
                                          layout_seed=seed_from(cfg.seed, "minibatch", epoch, 0))
            row, t = trainer.step(batch, idx, ppo_epoch=ppo, batch_index=b_idx)
            rows.append(row)
            timing.append(t)
            done_here += 1
            advance(1)
            if after_step is not None and main:
                after_step(trainer, row)
            if state_path is not None and (trainer.version % tc.checkpoint_every == 0 or trainer.version == total):
                rng = trainer.rng_state()  # every rank: each rank's random streams, gathered
                if main:
                    _save_state(state_path, trainer.state(rng, resume_key=resume_key, rows=rows, timing=timing,
                                                          epoch=epoch, old=batch.old, old_version=batch.old_version,
                                                          mismatch=batch.mismatch))
            if stop_after is not None and done_here >= stop_after and trainer.version < total:
                raise TrainingInterrupted(f"stopped after step {trainer.version} (stop_after={stop_after})")
    return TrainResult(steps=rows, timing=timing, adapter_dir=trainer.save_adapter(out_dir) if main else out_dir)


def _silent(_msg: str) -> None:
    """The log of ranks other than 0."""


def _train_in_group(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
                    log: Callable[[str], None], kw: dict[str, Any]) -> TrainResult:
    """One spawned rank of :func:`train_distributed` (module level, so that it pickles)."""
    return train(cfg, model_dir, seqs, out_dir, log, **kw)


def train_distributed(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
                      log: Callable[[str], None] = print, **kw: Any) -> TrainResult:
    """:func:`train` over ``train.distributed.world_size`` processes (data-parallel: DDP, or FSDP2
    with ``train.distributed.fsdp``).

    With one process: :func:`train` here. Under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set), on
    rank 0: joins the group (``train.distributed.backend``) unless joined, sends this call to the
    other ranks, which wait in :func:`tasks.train.distributed.follow` (``harnessrl train``), and
    trains with them; the caller ends the group (:func:`tasks.train.distributed.finish`).
    Otherwise starts the processes with torch's launcher (:func:`tasks.train.distributed.launch`,
    spawn) and returns rank 0's result. Either way every argument must pickle (``log`` and
    ``after_step``: module-level functions, loggers' bound methods, picklable objects).

    Raises:
        RuntimeError: the backend cannot run here (``nccl`` without CUDA); under ``torchrun``,
            ``WORLD_SIZE`` differs from ``train.distributed.world_size`` or this is not rank 0.
        torch.multiprocessing.ProcessRaisedException: a spawned rank raised (its traceback in
            the message), e.g. :class:`TrainingInterrupted` or ValueError of :func:`train`.
    """
    import torch.distributed as dist

    from tasks.train import distributed as D

    dc = cfg.train.distributed
    world = dc.world_size if dc is not None else 1
    backend = dc.backend if dc is not None else "gloo"
    if D.under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if env_world != world:
            raise RuntimeError(f"train.distributed.world_size={world} but torchrun started {env_world} processes "
                               f"(WORLD_SIZE); set train.distributed.world_size: {env_world}")
        if D.join(backend).rank != 0:
            raise RuntimeError("train_distributed runs on rank 0 under torchrun; the other ranks wait in "
                               "tasks.train.distributed.follow (harnessrl train)")
        D.send_job(_train_in_group, (cfg, model_dir, seqs, out_dir, log, kw))
        return train(cfg, model_dir, seqs, out_dir, log, **kw)
    if world == 1 or (dist.is_available() and dist.is_initialized()):
        return train(cfg, model_dir, seqs, out_dir, log, **kw)
    return D.launch(_train_in_group, (cfg, model_dir, seqs, out_dir, log, kw), world, backend)


@dataclass
class SampledBatch:
    """What an online sampler returns for one iteration: the training sequences (each with the
    ``policy_version`` that sampled it), the episodes left out by rule, the rows to keep
    (``episodes`` / ``turns``), the seconds the sampler spent generating, and the sync canary's
    max |logp diff| for the weights that sampled it (NaN: the initial weights, never synced)."""

    seqs: list[TrainSequence]
    dropped: dict[str, int]
    rows: dict[str, Any]
    sample_s: float = 0.0
    sync_diff: float = float("nan")


class OnlineSampler(Protocol):
    """What :func:`train_online` needs from a sampler. ``submit(iteration)`` starts sampling that
    iteration's batch with the weights of the last :meth:`sync` (it may return at once and
    generate in the background); ``collect()`` returns the oldest submitted batch, in submission
    order; ``sync(trainer)`` makes the trainer's current weights the ones later submissions use
    and returns ``{"sync_s", "max_abs_logp_diff"}`` (raising when the engine's log-probs of the
    canary probe differ from the trainer's by more than the tolerance)."""

    def submit(self, iteration: int) -> None: ...

    def collect(self) -> SampledBatch: ...

    def sync(self, trainer: Trainer) -> dict[str, float]: ...


def train_online(cfg: RunConfig, model_dir: Path, sampler: OnlineSampler | Callable[[Trainer, int], Any],
                 out_dir: Path, log: Callable[[str], None] = print, *, state_path: Path | None = None,
                 resume_key: str = "", after_iteration: Callable[[Trainer, int], None] | None = None
                 ) -> tuple[TrainResult, list[dict[str, Any]]]:
    """Online mode: ``train.steps`` iterations, each a fresh batch from the sampler trained on for
    ``train.ppo_epochs`` passes of mini-batches; the sampler may run ahead of the trainer by at
    most ``train.max_staleness`` policy versions.

    Asynchrony (P5): before training on batch i, the following batches are submitted at once, with
    the last synced weights, as long as each will be at most ``max_staleness`` versions stale when
    its first step comes; the next batch is otherwise submitted after the trainer has finished
    batch i and synced. ``max_staleness: 0`` is strictly on-policy (with one mini-batch per batch,
    every step's staleness is 0). Weights are synced after every batch. Each step's row records
    the staleness of its samples (the bound holds at a batch's first step; its later mini-batches
    add their own, as in any PPO epoch).

    Args:
        sampler: an :class:`OnlineSampler`, or a function ``(trainer, iteration) -> SampledBatch``
            (called synchronously with the trainer at its current version; for tests).
        state_path, resume_key: the resumable state, saved after every iteration; a resumed run
            continues with the next iteration (resampled from the current weights). With
            ``max_staleness: 0`` it ends bit-identical to an uninterrupted run (random streams
            included); with ``max_staleness`` > 0 the batches sampled ahead with older weights are
            lost and resampled with the saved weights, so the run departs from the uninterrupted one.
        after_iteration: called with the trainer and the iteration index after each iteration.

    Returns ``(TrainResult, sampled)`` where ``sampled`` collects each batch's ``rows``.
    """
    tc = cfg.train
    trainer = Trainer(cfg, model_dir, log)
    if callable(sampler) and not hasattr(sampler, "submit"):
        sampler = _CallbackSampler(sampler, trainer)
    rows: list[dict[str, Any]] = []
    timing: list[dict[str, float]] = []
    phases: list[dict[str, float]] = []
    sampled: list[dict[str, Any]] = []
    start = 0
    st = _resume(state_path, resume_key, log)
    if st is not None:
        trainer.load(st)
        rows, timing, sampled, phases, start = st["rows"], st["timing"], st["sampled"], st["phases"], st["iteration"] + 1
    if trainer.version > 0:
        sampler.sync(trainer)
    if st is not None:  # where the saved run stood after its sync (a sync draws nothing; to be sure)
        trainer.restore_rng(st)
    synced_version = trainer.version
    next_submit = start  # the next iteration to hand to the sampler
    steps_per_batch = 1  # estimated from the last batch: the lag of a batch submitted ahead
    for it in range(start, tc.steps):
        t_iter = time.perf_counter()
        if next_submit == it:
            sampler.submit(it)
            next_submit += 1
        t_wait = time.perf_counter()
        sb = sampler.collect()
        wait_s = time.perf_counter() - t_wait
        sampled.append(sb.rows)
        t_train = time.perf_counter()
        batch = trainer.new_batch(sb.seqs, epoch=it, dropped=sb.dropped, sync_diff=sb.sync_diff,
                                  layout_seed=seed_from(cfg.seed, "minibatch", it, 0))
        schedule = [(ppo, b, idx) for ppo in range(tc.ppo_epochs)
                    for b, idx in enumerate(minibatches(batch.plan.groups, tc.batch_size,
                                                        seed_from(cfg.seed, "minibatch", it, ppo)))]
        steps_per_batch = len(schedule)
        # run ahead: batch j, sampled now with the last synced weights, will first be trained at
        # about version + (j - it) * steps_per_batch; submit while that lag is within the bound
        while next_submit < tc.steps and (trainer.version + (next_submit - it) * steps_per_batch - synced_version
                                          <= tc.max_staleness):
            sampler.submit(next_submit)
            next_submit += 1
        for ppo, b_idx, idx in schedule:
            row, t = trainer.step(batch, idx, ppo_epoch=ppo, batch_index=b_idx)
            rows.append(row)
            timing.append(t)
        train_s = time.perf_counter() - t_train
        sync = sampler.sync(trainer) if it + 1 < tc.steps else {"sync_s": 0.0, "max_abs_logp_diff": math.nan}
        synced_version = trainer.version
        phases.append({"iteration": it, "iter_s": time.perf_counter() - t_iter, "sample_s": sb.sample_s,
                       "wait_s": wait_s, "sync_s": sync["sync_s"], "train_s": train_s,
                       "sync_max_abs_logp_diff": sync["max_abs_logp_diff"], "sync_bytes": sync.get("sync_bytes", 0.0)})
        log(f"train: iteration {it + 1}/{tc.steps}: {len(schedule)} step(s), sample {sb.sample_s:.1f} s "
            f"(waited {wait_s:.1f} s), train {train_s:.1f} s, sync {sync['sync_s']:.1f} s")
        if after_iteration is not None:
            after_iteration(trainer, it)
        if state_path is not None:
            _save_state(state_path, trainer.state(resume_key=resume_key, rows=rows, timing=timing, sampled=sampled,
                                                  phases=phases, iteration=it))
    return (TrainResult(steps=rows, timing=timing, adapter_dir=trainer.save_adapter(out_dir), phases=phases),
            sampled)


class _CallbackSampler:
    """An :class:`OnlineSampler` over a plain function ``fn(trainer, iteration) -> SampledBatch``:
    ``submit`` calls it at once with the trainer (so the batch comes from the weights of that
    moment, i.e. the last sync), ``sync`` only records the version."""

    def __init__(self, fn: Callable[[Trainer, int], SampledBatch], trainer: Trainer):
        self.fn, self.trainer = fn, trainer
        self.queue: list[SampledBatch] = []

    def submit(self, iteration: int) -> None:
        t0 = time.perf_counter()
        sb = self.fn(self.trainer, iteration)
        sb.sample_s = time.perf_counter() - t0
        self.queue.append(sb)

    def collect(self) -> SampledBatch:
        return self.queue.pop(0)

    def sync(self, trainer: Trainer) -> dict[str, float]:
        return {"sync_s": 0.0, "max_abs_logp_diff": math.nan}
