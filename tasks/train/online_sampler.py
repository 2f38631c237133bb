"""The sampler of online training: fresh episodes from the current policy each iteration, by an
engine that syncs the trainer's weights in place (vLLM) or one built in process from them (hf).
Used by the train stage (:func:`tasks.train.stage.run_train`) and by ``benchmarks/learning.py``."""

from __future__ import annotations

import logging
from typing import Any, Callable

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig

log = logging.getLogger("harnessrl.train")


def online_sampler(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], specs: dict,
                    sampling: dict, base_id: str, arm: str | None = None) -> tuple[Any, Callable[[], None]]:
    """The sampler of :func:`tasks.train.loops.train_online` and a function that releases it.

    Iteration i samples the train records of :func:`tasks.train.batches.tasks_for_iteration`'s
    tasks (under ``train.harnesses`` only, when set), ``rollout.samples_per_task`` episodes each, with the current policy, the version
    recorded in every episode:

    - an engine that syncs in place (registry ``online: in_place``,
      :data:`tasks.config.engines.ENGINES`: ``vllm``): one engine started on the base model for
      the whole run, the trainer's merged weights (or, with ``policy.vllm.lora: delta``, only the
      adapter's factors) loaded into it in place after each batch
      (:class:`tasks.train.online.EngineSampler`, with the sync canary), generation on a background
      thread so that the sampler can run ahead (``train.max_staleness``); when it can, on the CPU,
      the cores are split between the engine and the trainer until release
      (:func:`tasks.train.online.cpu_thread_split`);
    - an engine built in process (``online: in_process``: ``hf``): the trainer's adapter merged
      into a fresh copy in ``policy.rollout_dtype`` each iteration, wrapped by the engine class's
      ``from_model``, sampled in this thread.

    ``arm``: the training arm's name, put in the policy id (``<base>+<arm>+online-v<version>``) so
    that episode ids, content hashes that include the policy id, stay unique across arms; None (no
    ``arms``): ``<base>+online-v<version>``.
    """
    from tasks.hashing import seed_from
    from tasks.rollout.runner import episode_rows, run_records
    from tasks.train.batches import tasks_for_iteration
    from tasks.train.loops import SampledBatch
    from tasks.train.sequences import build_sequences

    tc = cfg.train
    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    test = {t["task_hash"] for t in tasks.values() if t["split"] == "test"}
    records = [r for r in store.rows(inputs["records"]) if r["split"] == "train" and r["task_hash"] not in test
               and (tc.harnesses is None or r["harness_name"] in tc.harnesses)]

    run_cfg = cfg  # the config the episodes run with (an in-place engine beside the trainer: its threads)

    def pid(version: int) -> str:
        return f"{base_id}+{arm}+online-v{version}" if arm is not None else f"{base_id}+online-v{version}"

    def batch(policy: Any, iteration: int, version: int) -> SampledBatch:
        chosen = set(tasks_for_iteration([r["task_id"] for r in records], tc.prompts_per_step, iteration,
                                         seed_from(cfg.seed, "online-tasks")))
        eps, turns = run_records(policy, run_cfg, specs, tasks, [r for r in records if r["task_id"] in chosen],
                                 cfg.rollout.samples_per_task, seed_from(cfg.seed, "online", iteration),
                                 f"online:{iteration}")
        rows = episode_rows(eps, pid(version), version)
        seqs, dropped = build_sequences(rows, turns, sampling, drop_stop_reasons=tc.drop_stop_reasons,
                                        truncated_reward=tc.truncated_reward)
        return SampledBatch(seqs=seqs, dropped=dropped, rows={"episodes": rows, "turns": turns})

    from tasks.config.engines import engine_entry

    if engine_entry(cfg.policy.engine).online == "in_place":
        from tasks.rollout.engines import load_policy
        from tasks.train.online import EngineSampler, sync_tolerance

        # the engine samples while the trainer trains: on the CPU the cores are split between them
        engine_cfg, run_cfg, restore_threads = (_cpu_thread_split(cfg) if tc.max_staleness > 0 and cfg.policy.device == "cpu"
                                                else (cfg, cfg, lambda: None))
        try:
            engine = load_policy(engine_cfg)
        except BaseException:
            restore_threads()
            raise

        def on_engine(policy: Any, iteration: int, version: int) -> SampledBatch:
            policy.policy_id = pid(version)  # the weights it holds now, not the base model it started with
            return batch(policy, iteration, version)

        sampler = EngineSampler(engine, on_engine, dtype=cfg.policy.rollout_dtype, tolerance=sync_tolerance(cfg),
                                adapter_only=cfg.policy.vllm.lora_mode(cfg.policy.device) == "delta", log=log.info)

        def release() -> None:
            try:
                sampler.close()
                engine.close()
            finally:
                restore_threads()

        return sampler, release

    from tasks.rollout.engines import engine_class

    engine_cls = engine_class(cfg.policy.engine)

    def in_process(trainer: Any, iteration: int) -> SampledBatch:
        policy = engine_cls.from_model(trainer.inference_model(cfg.policy.rollout_dtype), trainer.tokenizer,
                                       cfg.policy, policy_id=pid(trainer.version))
        return batch(policy, iteration, trainer.version)

    return in_process, lambda: None


def _cpu_thread_split(cfg: RunConfig) -> tuple[RunConfig, RunConfig, Callable[[], None]]:
    """For an in-place engine that generates on the CPU while the trainer trains: the engine's
    config (its ``policy.torch_threads``), the config the sampler's episodes run with (this
    process's torch threads: the trainer's) and a function that restores this process's thread
    count. The split: :func:`tasks.train.online.cpu_thread_split` of the cores this process may
    run on. This process's torch threads are set to the trainer's share now."""
    import os

    import torch

    from tasks.train.online import cpu_thread_split

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_engine, n_trainer = cpu_thread_split(cores, cfg.policy.torch_threads)
    before = torch.get_num_threads()
    torch.set_num_threads(n_trainer)
    log.info("train: the engine samples while the trainer trains, on %d CPU core(s): engine %d thread(s), trainer %d",
             cores, n_engine, n_trainer)

    def with_threads(n: int) -> RunConfig:
        return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"torch_threads": n})})

    return with_threads(n_engine), with_threads(n_trainer), lambda: torch.set_num_threads(before)
