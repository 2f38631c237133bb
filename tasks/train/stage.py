"""The train stage: ``episodes`` + ``turns`` -> a LoRA adapter + ``train_steps`` + ``checkpoints``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.hashing import sha256_dir, sha256_json
from tasks.rollout.stage import harness_specs

log = logging.getLogger("harnessrl.train")


class LeakageError(RuntimeError):
    """Test-split data reached a stage that must never see it; the message lists the tasks."""


def run_train(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Train one adapter per training arm on the rollouts (:meth:`RunConfig.arm_configs`: ``final``
    without ``arms``). Refuses any episode of a test-split task (checked by task hash against the
    frozen ``tasks`` artifact, not by the episode's own split label).

    Every arm starts from the same inputs and seed with its own TrainConfig. Its resumable state is
    ``train/state/<arm>/trainer_state.pt`` (``train/state/trainer_state.pt`` without ``arms``), keyed
    by the arm's config and the inputs, so a rerun after a crash finishes the arms already done at
    once and resumes the interrupted one. Checkpoints: ``train/checkpoints/<arm>/step-<steps>``
    (``train/checkpoints/step-<steps>`` without ``arms``).

    Returns ``train_steps`` (one row per optimizer step, tagged with its ``arm``; wall-clock timing
    per step, with its arm, in the manifest's ``extra.timing``), ``checkpoints`` (``base`` + one
    row per arm, named by the arm) and, when any arm trains online, ``online_episodes`` /
    ``online_turns`` (every online arm's rows, in arm order).

    Episodes of ``talkmesh`` harnesses train the talk policy: one sequence per hint or revision turn
    with its talk reward (:func:`tasks.talkmesh.episodes.talk_train_sequences`; their rows are also
    written as ``talkmesh_talk_sequences``); the other episodes as one sequence each.

    Raises:
        LeakageError: a test-split task among the rollouts.
        ValueError: a talkmesh harness with an online arm (not supported), or talkmesh rollouts
            with no hint or revision to train on.
    """
    from tasks.rollout.models import model_id, resolve_model
    from tasks.train.sequences import build_sequences
    from tasks.train.trainer import normalize_adapter_config, train, train_online

    test_hashes = {t["task_hash"]: t["task_id"] for t in store.rows(inputs["tasks"]) if t["split"] == "test"}
    episodes = store.rows(inputs["episodes"])
    leaked = sorted({test_hashes[e["task_hash"]] for e in episodes if e["task_hash"] in test_hashes})
    if leaked:
        raise LeakageError(f"train: {len(leaked)} test-split task(s) in the training rollouts: {leaked[:10]}")
    specs = harness_specs(store, inputs["harnesses"])
    sampling = {hid: (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p) for hid, s in specs.items()}
    from tasks.talkmesh.episodes import is_mesh, talk_train_sequences

    mesh_ids = {hid for hid, s in specs.items() if is_mesh(s)}
    mesh_eps = [e for e in episodes if e["harness_id"] in mesh_ids]
    online_arms = [arm for arm, tc in cfg.arm_configs() if tc.mode != "frozen"]
    if mesh_eps and online_arms:
        raise ValueError(f"train: arm(s) {online_arms} train online, which is not supported with a talkmesh harness "
                         f"({sorted({e['harness_name'] for e in mesh_eps})}): use train.mode frozen")
    turns = store.rows(inputs["turns"])
    seqs = build_sequences([e for e in episodes if e["harness_id"] not in mesh_ids], turns, sampling)
    talk_rows: list[dict[str, Any]] = []
    if mesh_eps:  # the talk policy's GRPO batch: one sequence per hint / revision (tasks.talkmesh.talk)
        talk_seqs, talk_rows = talk_train_sequences(mesh_eps, turns, specs)
        if not talk_seqs:
            raise ValueError("train: the talkmesh rollouts hold no hint or revision with a reward (no agent was below "
                             "mesh.threshold?); nothing to train the talk policy on")
        seqs += talk_seqs
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    base_id = model_id(model_dir)
    in_hashes = {k: v.sha256 for k, v in sorted(inputs.items())}
    multi = cfg.arms is not None
    steps: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    ckpts = [{"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": base_id}]
    online: list[dict] = []
    for arm, arm_train in cfg.arm_configs():
        acfg = cfg.model_copy(update={"train": arm_train}) if multi else cfg
        key = {"config": acfg.section_hash("policy", "train", "rollout", "sandbox"), "inputs": in_hashes}
        resume_key = sha256_json({"arm": arm, **key} if multi else key)
        sub = f"{arm}/" if multi else ""
        with tempfile.TemporaryDirectory(prefix="harnessrl-adapter-") as tmp:
            # the resumable state lives in the run folder for a local store (a rerun after a kill
            # resumes from it), in a temporary folder otherwise
            state = (Path(store.root) if store.is_local else Path(tmp)) / "train" / "state" / sub / "trainer_state.pt"
            log.info("train: arm %s (%s, grouping %s, %d steps)", arm, arm_train.algorithm, arm_train.grouping,
                     arm_train.steps)
            if arm_train.mode == "frozen":
                result = train(acfg, model_dir, seqs, Path(tmp) / "adapter", log=log.info, state_path=state,
                               resume_key=resume_key)
            else:
                sample = _online_sampler(store, acfg, inputs, specs, sampling, base_id, arm if multi else None)
                result, arm_online = train_online(acfg, model_dir, sample, Path(tmp) / "adapter", log=log.info,
                                                  state_path=state, resume_key=resume_key)
                online += arm_online
            # adapter_config.json records the absolute base-model path; keep the folder machine-independent
            normalize_adapter_config(result.adapter_dir, base_model_id=base_id)
            sha = sha256_dir(result.adapter_dir)
            rel = f"train/checkpoints/{sub}step-{arm_train.steps}"
            store.put_dir(rel, result.adapter_dir)
        steps += [{"arm": arm, **r} for r in result.steps]
        timing += [{"arm": arm, **t} for t in result.timing]
        ckpts.append({"name": arm, "step": arm_train.steps, "path": rel, "adapter_sha256": sha,
                      "base_model_id": base_id})
    ch = cfg.section_hash("policy", "train", "arms", "sweep", "rollout", "sandbox")
    ins = [inputs["episodes"], inputs["turns"], inputs["harnesses"], inputs["tasks"]]
    steps_ref = store.write("train", "train_steps", steps, inputs=ins, config_hash=ch, extra={"timing": timing})
    ck_ref = store.write("train", "checkpoints", ckpts, inputs=[steps_ref, *ins], config_hash=ch)
    out = {"train_steps": steps_ref, "checkpoints": ck_ref}
    if talk_rows:
        out["talkmesh_talk_sequences"] = store.write("train", "talkmesh_talk_sequences", talk_rows, inputs=ins,
                                                     config_hash=ch)
    if online:
        out["online_episodes"] = store.write("train", "online_episodes", [r for o in online for r in o["episodes"]],
                                             contract="episodes", inputs=ins, config_hash=ch)
        out["online_turns"] = store.write("train", "online_turns", [r for o in online for r in o["turns"]],
                                          contract="turns", inputs=ins, config_hash=ch)
    return out


def _online_sampler(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], specs: dict,
                    sampling: dict, base_id: str, arm: str | None = None) -> Any:
    """The ``sample`` callback of :func:`train_online`: ``rollout.samples_per_task`` episodes per
    train record, generated by the trainer's current policy (its adapter merged into a copy in
    ``policy.rollout_dtype``), with the version recorded in every episode. ``arm``: the training
    arm's name, put in the policy id (``<base>+<arm>+online-v<version>``) so that episode ids,
    content hashes that include the policy id, stay unique across arms; None (no ``arms``):
    ``<base>+online-v<version>``."""
    from tasks.hashing import seed_from
    from tasks.rollout.policy import HFPolicy
    from tasks.rollout.stage import episode_rows, run_records
    from tasks.train.sequences import build_sequences

    tasks = {t["task_id"]: t for t in store.rows(inputs["tasks"])}
    test = {t["task_hash"] for t in tasks.values() if t["split"] == "test"}
    records = [r for r in store.rows(inputs["records"]) if r["split"] == "train" and r["task_hash"] not in test]

    def sample(trainer: Any, version: int, iteration: int) -> tuple[list, dict]:
        pid = f"{base_id}+{arm}+online-v{version}" if arm is not None else f"{base_id}+online-v{version}"
        policy = HFPolicy.from_model(trainer.inference_model(cfg.policy.rollout_dtype), trainer.tokenizer, cfg.policy,
                                     policy_id=pid)
        eps, turns = run_records(policy, cfg, specs, tasks, records, cfg.rollout.samples_per_task,
                                 seed_from(cfg.seed, "online", iteration), f"online:{iteration}")
        rows = episode_rows(eps, pid, version)
        return build_sequences(rows, turns, sampling), {"episodes": rows, "turns": turns}

    return sample
