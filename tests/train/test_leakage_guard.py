"""Test-split tasks never reach the trainer, and the evaluate stage refuses to run if they did."""

import pytest

from schemas import ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.stage import run_evaluate
from tasks.records.freeze import freeze_tables
from tasks.records.split_guard import LeakageError
from tasks.train.stage import run_train


@pytest.fixture
def leaky_store(tmp_path):
    cfg = RunConfig.model_validate({"name": "leak", "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 2}],
                                    "harnesses": ["direct"]})
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp_path)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    test_task = next(t for t in tasks if t["split"] == "test")
    rec = next(r for r in records if r["task_id"] == test_task["task_id"])
    # an episode of a test task whose own label claims "train": the guard checks the hash, not the label
    ep = {"episode_id": "e0", "record_id": rec["record_id"], "task_id": rec["task_id"], "task_hash": rec["task_hash"],
          "harness_id": rec["harness_id"], "harness_name": rec["harness_name"], "split": "train", "policy_id": "p",
          "policy_version": 0, "group_id": "g", "sample_idx": 0, "seed": 0, "reward": 1.0, "success": True,
          "status": "ok", "stop_reason": "submitted", "num_turns": 1, "input_tokens": 3, "output_tokens": 2,
          "final_answer": "1", "answer_parsed": True}
    turn = {"episode_id": "e0", "turn_idx": 0, "prompt_continues": False, "prompt_added_ids": [1, 2, 3], "completion_token_ids": [4, 5],
            "completion_logprobs": [-1.0, -1.0], "loss_mask": [1, 1], "completion_text": "x", "finish_reason": "stop",
            "action": "{}", "observation": "", "read_spans": "[]"}
    refs["episodes"] = store.write("rollout", "episodes", [ep])
    refs["turns"] = store.write("rollout", "turns", [turn])
    return cfg, store, refs, test_task["task_id"]


def test_trainer_refuses_test_split_episodes_by_hash(leaky_store):
    cfg, store, refs, task_id = leaky_store
    with pytest.raises(LeakageError, match=f"train: 1 test-split task.*{task_id}"):
        run_train(store, cfg, refs)
    assert not store.exists("train/train_steps.parquet")


def test_evaluate_refuses_when_test_tasks_were_trained_on(leaky_store):
    cfg, store, refs, task_id = leaky_store
    refs["checkpoints"] = store.write("train", "checkpoints", [
        {"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "m"}])
    with pytest.raises(LeakageError, match=f"evaluate: 1 test-split task.*{task_id}"):
        run_evaluate(store, cfg, refs)
    assert not store.exists("evaluate/plan.json")  # refused before any plan or attempt
