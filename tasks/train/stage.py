"""The train stage: ``episodes`` + ``turns`` -> a LoRA adapter + ``train_steps`` + ``checkpoints``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.hashing import sha256_dir, sha256_json
from tasks.records.split_guard import check_train_rollouts
from tasks.harnesses.frozen import harness_specs
from tasks.train.online_sampler import online_sampler

log = logging.getLogger("harnessrl.train")


def run_train(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Train one adapter per training arm on the rollouts (:meth:`RunConfig.arm_configs`: ``final``
    without ``arms``). Refuses any episode of a test-split task (checked by task hash against the
    frozen ``tasks`` artifact, not by the episode's own split label).

    Every arm starts from the same inputs and seed with its own TrainConfig; an arm's training seed
    (``train.seed``, set per checkpoint by ``train.seeds``: ``<arm>@s<seed>``) replaces the run's
    seed for everything it draws (:class:`tasks.config.train.TrainConfig`). Its resumable state is
    ``train/state/<arm>/trainer_state.pt`` (``train/state/trainer_state.pt`` without ``arms``), keyed
    by the arm's config and the inputs, so a rerun after a crash finishes the arms already done at
    once and resumes the interrupted one. With ``train.distributed.world_size`` N > 1 a frozen arm
    trains data-parallel over N processes (:func:`tasks.train.loops.train_distributed`: started
    here with torch's launcher, or joining ``torchrun``'s group); rank 0 writes the adapter, the
    state and the snapshots. Checkpoints: ``train/checkpoints/<arm>/step-<steps>``
    (``train/checkpoints/step-<steps>`` without ``arms``).

    Returns ``train_steps`` (one row per optimizer step, tagged with its ``arm``; wall-clock timing
    per step, with its arm, in the manifest's ``extra.timing``), ``checkpoints`` (``base`` + one
    row per arm, named by the arm) and, when any arm trains online, ``online_episodes`` /
    ``online_turns`` (every online arm's rows, in arm order).

    Episodes of a plugged-in loop type (:mod:`tasks.rollout.loop_plugins`) become sequences through
    its plugin, which also names artifacts to write (``talkmesh``: the talk policy's one sequence
    per hint or revision turn, written as ``talkmesh_talk_sequences``); the other episodes become
    one sequence each.

    Raises:
        tasks.records.split_guard.LeakageError: a test-split task among the rollouts.
        ValueError: an online arm with a loop type that trains offline only (``talkmesh``), or a
            plugin's episodes with nothing to train on.
    """
    from tasks.rollout.models import model_id, resolve_model
    from tasks.train.loops import train_distributed, train_online
    from tasks.train.sequences import build_sequences
    from tasks.train.trainer import normalize_adapter_config

    episodes = store.rows(inputs["episodes"])
    check_train_rollouts(store.rows(inputs["tasks"]), episodes)
    specs = harness_specs(store, inputs["harnesses"])
    sampling = {hid: (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p) for hid, s in specs.items()}
    from tasks.rollout.loop_plugins import plugin_of

    loop_of = {hid: p for hid, p in ((hid, plugin_of(s)) for hid, s in specs.items()) if p is not None}
    plugin_eps = [e for e in episodes if e["harness_id"] in loop_of]
    online_arms = [arm for arm, tc in cfg.arm_configs() if tc.mode != "frozen"]
    offline_only = sorted({loop_of[e["harness_id"]].loop_type for e in plugin_eps
                           if not loop_of[e["harness_id"]].trains_online})
    if offline_only and online_arms:
        raise ValueError(f"train: arm(s) {online_arms} train online, which is not supported with a {offline_only[0]} "
                         f"harness ({sorted({e['harness_name'] for e in plugin_eps})}): use train.mode frozen")
    turns = store.rows(inputs["turns"])
    plain_eps = [e for e in episodes if e["harness_id"] not in loop_of]
    plugin_seqs: list[Any] = []
    loop_artifacts: dict[str, list[dict[str, Any]]] = {}
    for plugin in sorted({id(p): p for p in loop_of.values()}.values(), key=lambda p: p.loop_type):
        own = [e for e in plugin_eps if loop_of[e["harness_id"]] is plugin]
        if own:  # e.g. talkmesh: the talk policy's GRPO batch, one sequence per hint / revision
            seqs_, arts = plugin.train_sequences(own, turns, specs)
            plugin_seqs += seqs_
            loop_artifacts.update(arts)
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    base_id = model_id(model_dir)
    in_hashes = {k: v.sha256 for k, v in sorted(inputs.items())}
    # arms, a sweep or training seeds: a checkpoint per arm, each in its own folder
    multi = cfg.arms is not None or cfg.sweep is not None or cfg.train.seeds is not None
    steps: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    ckpts = [{"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": base_id}]
    online: list[dict] = []
    for arm, arm_train in cfg.arm_configs():
        # the arm's train section; its training seed, when set, is the seed of everything it draws
        update: dict[str, Any] = {"train": arm_train} if multi else {}
        if arm_train.seed is not None:
            update["seed"] = arm_train.seed
        acfg = cfg.model_copy(update=update) if update else cfg
        key = {"config": acfg.section_hash("policy", "train", "rollout", "sandbox"), "inputs": in_hashes}
        resume_key = sha256_json({"arm": arm, **key} if multi else key)
        sub = f"{arm}/" if multi else ""
        with tempfile.TemporaryDirectory(prefix="harnessrl-adapter-") as tmp:
            # the resumable state lives in the run folder for a local store (a rerun after a kill
            # resumes from it), in a temporary folder otherwise
            state = (Path(store.root) if store.is_local else Path(tmp)) / "train" / "state" / sub / "trainer_state.pt"
            log.info("train: arm %s (%s, %s, grouping %s)", arm, arm_train.algorithm, arm_train.mode,
                     arm_train.grouping)
            snapshots: list[dict[str, Any]] = []
            snap = _Snapshotter(store, arm_train, arm, sub, base_id, Path(tmp), snapshots)
            if arm_train.mode == "frozen":
                arm_eps = [e for e in plain_eps if arm_train.harnesses is None or e["harness_name"] in arm_train.harnesses]
                seqs, dropped = build_sequences(arm_eps, turns, sampling, drop_stop_reasons=arm_train.drop_stop_reasons,
                                                truncated_reward=arm_train.truncated_reward)
                result = train_distributed(acfg, model_dir, seqs + plugin_seqs, Path(tmp) / "adapter", log=log.info,
                                           dropped=dropped, state_path=state, resume_key=resume_key, after_step=snap)
            else:
                sample, release = online_sampler(store, acfg, inputs, specs, sampling, base_id,
                                                  arm if multi else None)
                try:
                    result, arm_online = train_online(acfg, model_dir, sample, Path(tmp) / "adapter", log=log.info,
                                                      state_path=state, resume_key=resume_key,
                                                      after_iteration=snap)
                finally:
                    release()
                online += arm_online
            # adapter_config.json records the absolute base-model path; keep the folder machine-independent
            normalize_adapter_config(result.adapter_dir, base_model_id=base_id)
            sha = sha256_dir(result.adapter_dir)
            n_steps = len(result.steps)
            rel = f"train/checkpoints/{sub}step-{n_steps}"
            store.put_dir(rel, result.adapter_dir)
        steps += [{"arm": arm, **r} for r in result.steps]
        timing += [{"arm": arm, **t} for t in result.timing]
        phases += [{"arm": arm, **p} for p in result.phases]
        ckpts += _snapshot_rows(store, arm_train, arm, sub, base_id, n_steps, snapshots)
        ckpts.append({"name": arm, "step": n_steps, "path": rel, "adapter_sha256": sha, "base_model_id": base_id})
    ch = cfg.section_hash("policy", "train", "arms", "sweep", "rollout", "sandbox")
    ins = [inputs["episodes"], inputs["turns"], inputs["harnesses"], inputs["tasks"]]
    steps_ref = store.write("train", "train_steps", steps, inputs=ins, config_hash=ch,
                            extra={"timing": timing, "phases": phases})
    ck_ref = store.write("train", "checkpoints", ckpts, inputs=[steps_ref, *ins], config_hash=ch)
    out = {"train_steps": steps_ref, "checkpoints": ck_ref}
    for name, rows in loop_artifacts.items():
        out[name] = store.write("train", name, rows, inputs=ins, config_hash=ch)
    if online:
        out["online_episodes"] = store.write("train", "online_episodes", [r for o in online for r in o["episodes"]],
                                             contract="episodes", inputs=ins, config_hash=ch)
        out["online_turns"] = store.write("train", "online_turns", [r for o in online for r in o["turns"]],
                                          contract="turns", inputs=ins, config_hash=ch)
    return out


class _Snapshotter:
    """A callback ``(trainer, *_)`` saving the trainer's adapter every ``train.save_every``
    optimizer steps as the checkpoint ``<arm>-step<n>`` (``train/checkpoints/<sub>step-<n>``),
    appending its row to ``out``; a no-op without ``save_every``. A step already saved (a resumed
    run) is skipped. It pickles (the spawned processes of distributed training call it on rank 0;
    their ``out`` does not come back, and :func:`_snapshot_rows` reads those snapshots back from
    the store)."""

    def __init__(self, store: ArtifactStore, tc: Any, arm: str, sub: str, base_id: str, tmp: Path,
                 out: list[dict[str, Any]]):
        self.store, self.tc, self.arm, self.sub, self.base_id, self.tmp, self.out = store, tc, arm, sub, base_id, tmp, out

    def __call__(self, trainer: Any, *_: Any) -> None:
        from tasks.train.trainer import normalize_adapter_config

        n = trainer.version
        if not self.tc.save_every or n % self.tc.save_every or any(c["step"] == n for c in self.out):
            return
        d = trainer.save_adapter(self.tmp / f"snapshot-{n}")
        normalize_adapter_config(d, base_model_id=self.base_id)
        rel = f"train/checkpoints/{self.sub}step-{n}"
        self.store.put_dir(rel, d)
        self.out.append({"name": f"{self.arm}-step{n}", "step": n, "path": rel, "adapter_sha256": sha256_dir(d),
                         "base_model_id": self.base_id})


def _snapshot_rows(store: ArtifactStore, tc: Any, arm: str, sub: str, base_id: str, total: int,
                   saved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``checkpoints`` rows of an arm's snapshots (every ``save_every`` steps before its last):
    those saved by this process, and those a killed earlier run saved before this one resumed
    (their folders are in the store; a resumed run is bit-identical, so they are the same)."""
    if not tc.save_every:
        return []
    mine = {c["step"]: c for c in saved}
    out = []
    for n in range(tc.save_every, total, tc.save_every):
        if n in mine:
            out.append(mine[n])
            continue
        rel = f"train/checkpoints/{sub}step-{n}"
        if not store.exists(f"{rel}/adapter_config.json"):
            raise FileNotFoundError(f"train: the snapshot at step {n} of arm {arm!r} ({rel}) is missing from the run "
                                    "folder; run the train stage again from scratch (--from train)")
        with tempfile.TemporaryDirectory(prefix="harnessrl-snapshot-") as tmp:
            sha = sha256_dir(store.get_dir(rel, Path(tmp) / "a"))
        out.append({"name": f"{arm}-step{n}", "step": n, "path": rel, "adapter_sha256": sha, "base_model_id": base_id})
    return out
