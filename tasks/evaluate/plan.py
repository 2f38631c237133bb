"""The sealed evaluation's plan and its config hash: what the evaluate stage will run, written and
committed before the first attempt (:mod:`tasks.evaluate.stage`), and the hash it stamps on its
artifacts (the CLI compares it to tell a stale evaluation)."""

from __future__ import annotations

from typing import Any

from schemas import ArtifactRef
from tasks.config import RunConfig
from tasks.evaluate.findings import FINDINGS_RULE
from tasks.evaluate.prereg import arm_seeds, default_contrasts
from tasks.rollout.loop_plugins import state_artifacts


def build_plan(cfg: RunConfig, tasks: list[dict[str, Any]], records: list[dict[str, Any]],
               checkpoints: list[dict[str, Any]], inputs: dict[str, ArtifactRef]) -> dict[str, Any]:
    """The evaluation plan: every (test record, checkpoint, attempt) that will run, and how, with
    the pre-registered contrasts and the held-out (evaluation-only) harnesses marked.

    Raises:
        ValueError: no test record under an evaluation harness, or a contrast names a checkpoint
            that is not evaluated (the message names the contrast and the checkpoint).
    """
    eval_names = cfg.eval_harnesses()
    recs = sorted((r for r in records if r["split"] == "test" and r["harness_name"] in eval_names),
                  key=lambda r: (r["harness_name"], r["record_id"]))
    if not recs:
        raise ValueError("evaluate: no test-split records under the evaluation harnesses")
    missing = sorted(set(eval_names) - {r["harness_name"] for r in recs})
    if missing:
        raise ValueError(f"evaluate: no test-split records for evaluation harness(es) {missing} "
                         "(freeze again: the records predate evaluate.harnesses?)")
    ck_names = [c["name"] for c in checkpoints]
    seeded = arm_seeds(cfg)
    for arm, cks in seeded.items():
        if set(cks) - set(ck_names):
            raise ValueError(f"evaluate: arm {arm!r} trains under seeds {cks}, but the train stage wrote no checkpoint "
                             f"{sorted(set(cks) - set(ck_names))} (train again: --from train)")
    if cfg.evaluate.contrasts is None:
        contrasts = default_contrasts(checkpoints, sorted(eval_names), seeded)
    else:
        contrasts = [c.model_dump(mode="json") for c in cfg.evaluate.contrasts]
        for c in contrasts:
            for side in ("a", "b"):
                if c[side]["checkpoint"] not in ck_names and c[side]["checkpoint"] not in seeded:
                    raise ValueError(f"evaluate.contrasts[{c['name']!r}].{side}.checkpoint="
                                     f"{c[side]['checkpoint']!r} is not a checkpoint of this run {ck_names}")
    trained_on = "+".join(cfg.harnesses)
    # the suite of each test task, sealed where a contrast or finding counts one suite only
    by_suite = [it.suite for it in (cfg.evaluate.contrasts or []) + (cfg.evaluate.findings or []) if it.suite] + \
        [c.suite for f in cfg.evaluate.findings or [] for c in f.cells or [] if c.suite]
    suite_of = {t["task_id"]: t["suite"] for t in tasks if t["split"] == "test"} if by_suite else {}
    for name in by_suite:
        if name not in suite_of.values():
            raise ValueError(f"evaluate: suite {name!r} (a contrast's or finding's suite) has no test task; the run's "
                             f"test suites are {sorted(set(suite_of.values()))}")
    return {
        "version": 2,
        "records": [{"record_id": r["record_id"], "task_id": r["task_id"], "task_hash": r["task_hash"],
                     "harness_name": r["harness_name"], "harness_id": r["harness_id"]} for r in recs],
        "checkpoints": [{"name": c["name"], "path": c["path"], "adapter_sha256": c["adapter_sha256"],
                         "base_model_id": c["base_model_id"],
                         "train_harnesses": trained_on if c["path"] else ""} for c in checkpoints],
        "harnesses": sorted(eval_names),
        "held_out": sorted(cfg.held_out_harnesses()),
        "attempts": cfg.evaluate.attempts,
        "seed": cfg.evaluate.seed,
        "contrasts": contrasts,
        "min_graded_fraction": cfg.evaluate.min_graded_fraction,
        "infra_retries": cfg.evaluate.infra_retries,
        "alpha": cfg.evaluate.alpha,
        "bootstrap_resamples": cfg.evaluate.bootstrap_resamples,
        "power": cfg.evaluate.power,
        "policy": cfg.policy.model_dump(mode="json"),
        "sandbox": cfg.sandbox.model_dump(mode="json"),
        # the papers' headlines and their verdict rules (only when set: plans without keep their hash)
        **({"findings": [f.model_dump(mode="json") for f in cfg.evaluate.findings],
            "findings_rule": FINDINGS_RULE} if cfg.evaluate.findings else {}),
        # the arms trained under several seeds and their seed checkpoints (only when any is)
        **({"arm_seeds": seeded} if seeded else {}),
        # the findings threshold on infra errors, when the config sets it (unset: the documented default)
        **({"max_infra_error_fraction": cfg.evaluate.max_infra_error_fraction}
           if cfg.evaluate.max_infra_error_fraction is not None else {}),
        **({"suite_of": dict(sorted(suite_of.items()))} if suite_of else {}),
        "inputs": {k: v.sha256 for k, v in sorted(inputs.items())},
        # harnesses of a plugged-in loop type run with the rollout stage's fitted state (e.g. a
        # confidence head that scores its agents): sealed with its file
        **({"loop_states": states} if (states := {name: {"path": inputs[name].path, "sha256": inputs[name].sha256}
                                                   for name in state_artifacts() if name in inputs}) else {}),
    }


def evaluate_config_hash(cfg: RunConfig) -> str:
    """The config hash the evaluate stage stamps on its artifacts (the sections it reads)."""
    return cfg.section_hash("policy", "sandbox", "evaluate", "rollout")
