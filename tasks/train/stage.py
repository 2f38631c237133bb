"""The train stage: ``episodes`` + ``turns`` -> a LoRA adapter + ``train_steps`` + ``checkpoints``."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.hashing import sha256_dir, sha256_json
from tasks.rollout.stage import harness_specs

log = logging.getLogger("harnessrl.train")


class LeakageError(RuntimeError):
    """Test-split data reached a stage that must never see it; the message lists the tasks."""


def run_train(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Train an adapter on the rollouts. Refuses any episode of a test-split task (checked by
    task hash against the frozen ``tasks`` artifact, not by the episode's own split label)."""
    from tasks.rollout.models import model_id, resolve_model
    from tasks.train.sequences import build_sequences
    from tasks.train.trainer import train

    test_hashes = {t["task_hash"]: t["task_id"] for t in store.rows(inputs["tasks"]) if t["split"] == "test"}
    episodes = store.rows(inputs["episodes"])
    leaked = sorted({test_hashes[e["task_hash"]] for e in episodes if e["task_hash"] in test_hashes})
    if leaked:
        raise LeakageError(f"train: {len(leaked)} test-split task(s) in the training rollouts: {leaked[:10]}")
    specs = harness_specs(store, inputs["harnesses"])
    sampling = {hid: (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p) for hid, s in specs.items()}
    seqs = build_sequences(episodes, store.rows(inputs["turns"]), sampling)
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    base_id = model_id(model_dir)
    resume_key = sha256_json({"config": cfg.section_hash("policy", "train"),
                              "inputs": {k: v.sha256 for k, v in sorted(inputs.items())}})
    with tempfile.TemporaryDirectory(prefix="harnessrl-adapter-") as tmp:
        # the resumable state lives in the run folder for a local store (a rerun after a kill
        # resumes from it), in a temporary folder otherwise
        state = (Path(store.root) if store.is_local else Path(tmp)) / "train" / "state" / "trainer_state.pt"
        result = train(cfg, model_dir, seqs, Path(tmp) / "adapter", log=log.info, state_path=state,
                       resume_key=resume_key)
        # adapter_config.json records the absolute base-model path; keep the folder machine-independent
        conf = result.adapter_dir / "adapter_config.json"
        c = json.loads(conf.read_text())
        c["base_model_name_or_path"] = base_id
        conf.write_text(json.dumps(c, indent=2, sort_keys=True))
        sha = sha256_dir(result.adapter_dir)
        rel = f"train/checkpoints/step-{cfg.train.steps}"
        store.put_dir(rel, result.adapter_dir)
    ch = cfg.section_hash("policy", "train")
    ins = [inputs["episodes"], inputs["turns"], inputs["harnesses"], inputs["tasks"]]
    steps_ref = store.write("train", "train_steps", result.steps, inputs=ins, config_hash=ch,
                            extra={"timing": result.timing})
    ckpts = [
        {"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": base_id},
        {"name": "final", "step": cfg.train.steps, "path": rel, "adapter_sha256": sha, "base_model_id": base_id},
    ]
    ck_ref = store.write("train", "checkpoints", ckpts, inputs=[steps_ref, *ins], config_hash=ch)
    return {"train_steps": steps_ref, "checkpoints": ck_ref}
