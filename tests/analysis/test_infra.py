"""Infra errors per stage, counted from a run's artifacts: rollout episodes, online training's own
samples and the episodes each arm dropped, the findings threshold, and what the report and the run
summary show of them. (The evaluation's counts and the findings command: tests/evaluate/test_findings.py.)"""

import json

import pytest

from flows.summary import infra_line
from schemas import ArtifactStore
from tasks.analysis.infra import (InfraThresholdError, allowed, check_threshold, infra_counts, online_arm_names,
                                  row_fields, threshold_of, train_dropped)
from tasks.analysis.report import infra_section
from tasks.config import RunConfig


def _ep(i, status="ok", policy="p"):
    return {"episode_id": f"e{i}", "record_id": "r", "task_id": "t", "task_hash": "h", "harness_id": "hid",
            "harness_name": "direct", "split": "train", "policy_id": policy, "policy_version": 0, "group_id": "g",
            "sample_idx": i, "seed": 0, "reward": 0.0, "success": False, "status": status,
            "stop_reason": "infra_error" if status == "infra_error" else "submitted", "num_turns": 1,
            "input_tokens": 3, "output_tokens": 2, "final_answer": "", "answer_parsed": False}


_FLOATS = ("loss", "policy_loss", "kl", "kl_penalty", "entropy", "clip_frac", "ratio_min", "ratio_mean", "ratio_max",
           "grad_norm", "reward_mean", "zero_adv_frac", "lr", "logp_mismatch_mean", "logp_mismatch_max",
           "sync_max_abs_logp_diff")


def _step(arm, step, epoch, dropped):
    return {"arm": arm, "step": step, "epoch": epoch, "ppo_epoch": 0, "batch_index": 0, **dict.fromkeys(_FLOATS, 0.0),
            "tokens": 10, "sequences": 2, "policy_version_sampled": 0, "staleness": 0,
            "dropped": json.dumps(dropped, sort_keys=True)}


# frozen arm "fz": 2 epochs x 2 steps over the same rollouts (2 infra errors, 1 cut reply dropped);
# online arm "on": 3 iterations x 2 steps, each its own batch (1 + 0 + 2 infra errors)
STEPS = ([_step("fz", s, s // 2, {"infra_error": 2, "max_tokens": 1}) for s in range(1, 5)]
         + [_step("on", s, (s - 1) // 2, d) for s, d in zip(range(1, 7), [{"infra_error": 1}] * 2 + [{}] * 2
                                                              + [{"infra_error": 2}] * 2)])


def test_train_dropped_counts_a_frozen_arm_once_and_sums_an_online_arms_iterations():
    got = train_dropped(STEPS, online_arms=["on"])
    assert got == {"fz": {"infra_error": 2, "max_tokens": 1}, "on": {"infra_error": 3}}
    # read as frozen, the online arm's first batch stands for all of them
    assert train_dropped(STEPS, online_arms=[])["on"] == {"infra_error": 1}
    with pytest.raises(ValueError, match=r"arm 'fz' step 9: dropped='\[1\]' is not a JSON object"):
        train_dropped([{**_step("fz", 9, 0, {}), "dropped": "[1]"}], [])


def _run(tmp_path):
    store = ArtifactStore(tmp_path / "run")
    store.write("rollout", "episodes", [_ep(i, "infra_error" if i in (1, 4) else "ok") for i in range(5)])
    store.write("train", "train_steps", STEPS)
    store.write("train", "online_episodes", [_ep(i, "infra_error" if i % 2 else "ok", "p+on+online-v0")
                                             for i in range(6)], contract="episodes")
    return store


def test_infra_counts_read_each_stage_from_its_artifact(tmp_path):
    store = _run(tmp_path)
    got = infra_counts(store, ["on"])
    assert list(got) == ["rollout", "train"]  # no evaluation in this folder: left out, not zero
    assert got["rollout"] == {"planned": 5, "infra_errors": 2}
    assert got["train"] == {"planned": 6, "infra_errors": 3,
                            "dropped": {"fz": {"infra_error": 2, "max_tokens": 1}, "on": {"infra_error": 3}}}
    assert infra_counts(ArtifactStore(tmp_path / "empty")) == {}
    # a changed artifact is refused, not counted
    p = tmp_path / "run" / "rollout" / "episodes.parquet"
    p.write_bytes(p.read_bytes() + b"x")
    from schemas import ArtifactError

    with pytest.raises(ArtifactError, match="SHA-256"):
        infra_counts(store)


def test_the_threshold_names_the_stage_the_count_and_the_limit():
    counts = {"rollout": {"planned": 640, "infra_errors": 161}, "train": {"planned": 0, "infra_errors": 0},
              "evaluate": {"planned": 200, "infra_errors": 1}}
    with pytest.raises(InfraThresholdError) as e:
        check_threshold(counts, 0.0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rollout: 161 infra error(s) of 640 episodes, above the findings "
                                              "threshold of 0 (evaluate.max_infra_error_fraction = 0)")
    assert allowed(640, 0.25) == 160 and allowed(200, 0.005) == 1 and allowed(7, 0.0) == 0
    with pytest.raises(InfraThresholdError, match=r"^rollout: 161 .* threshold of 160 "):
        check_threshold(counts, 0.25)  # 161 > floor(0.25 * 640)
    check_threshold({**counts, "rollout": {"planned": 640, "infra_errors": 160}}, 0.25)  # at the limit: published
    with pytest.raises(InfraThresholdError, match=r"^evaluate: 1 infra error\(s\) of 200 planned attempts"):
        check_threshold({**counts, "rollout": {"planned": 640, "infra_errors": 0}}, 0.0)
    check_threshold({"rollout": {"planned": 640, "infra_errors": 0}}, 0.0)
    with pytest.raises(ValueError, match=r"max_infra_error_fraction=1.5"):
        check_threshold(counts, 1.5)
    assert threshold_of({}) == 0.0 and threshold_of({"max_infra_error_fraction": 0.02}) == 0.02
    assert row_fields(counts, 0.0) == {"infra_errors": {"rollout": 161, "train": 0, "evaluate": 1},
                                       "infra_planned": {"rollout": 640, "train": 0, "evaluate": 200},
                                       "infra_total": 162, "infra_threshold": 0.0}


def test_online_arms_are_the_arms_that_do_not_train_frozen():
    cfg = RunConfig.model_validate({"name": "x", "suites": [{"name": "basic_arithmetic", "size": 20}],
                                    "harnesses": ["direct"],
                                    "arms": [{"name": "on", "train": {"mode": "online", "steps": 2}}, {"name": "fz"}]})
    assert online_arm_names(cfg) == ["on"]


def test_the_report_and_the_summary_show_every_stage(tmp_path):
    counts = infra_counts(_run(tmp_path), ["on"])
    counts["evaluate"] = {"planned": 80, "infra_errors": 1, "infra_attempts": 4, "retries": 3}
    md = "\n".join(infra_section(counts))
    assert "| rollout | 5 episodes | 2 | 0.400 | none |" in md
    assert "| train | 6 episodes | 3 | 0.500 | none |" in md
    assert "| evaluate | 80 attempts | 1 | 0.013 | 3 |" in md
    assert "| fz | 2 | max\\_tokens 1 |" in md and "| on | 3 | none |" in md
    assert infra_section({}) == []
    line = infra_line(counts)
    assert line == ("infra errors: rollout 2 of 5 episodes, train 3 of 6 sampled episodes (arms that dropped episodes "
                    "for an infra error: fz 2, on 3), evaluate 1 of 80 planned attempts after retries (4 sealed rows "
                    "ended in one, 3 retries)")
