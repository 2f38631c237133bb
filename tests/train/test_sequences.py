"""Which episodes train: every stop reason keeps its group place except infrastructure errors and
the reasons dropped on purpose; cut episodes score 0 unless their graded reward is asked for."""

import pytest

from tasks.train.sequences import build_sequences


def _episode(i, reason, reward=1.0):
    status = {"infra_error": "infra_error", "timeout": "timeout"}.get(reason, "ok")
    return {"episode_id": f"e{i}", "task_id": "t", "task_hash": "h", "harness_id": "H", "reward": reward,
            "status": status, "stop_reason": reason, "policy_version": 2}


def _turns(i):
    return [{"episode_id": f"e{i}", "turn_idx": 0, "prompt_continues": False, "prompt_added_ids": [1, 2], "completion_token_ids": [3, 4],
             "completion_logprobs": [-0.1, -0.2], "loss_mask": [1, 1], "action": "{}"}]


REASONS = ["submitted", "max_turns", "max_tokens", "timeout", "format_error", "infra_error"]


def test_default_keeps_everything_but_infra_errors_and_zeroes_cut_episodes():
    eps = [_episode(i, r) for i, r in enumerate(REASONS)]
    turns = [t for i in range(len(REASONS)) for t in _turns(i)]
    seqs, dropped = build_sequences(eps, turns, {"H": (1.0, 0, 1.0)})
    assert [s.stop_reason for s in seqs] == REASONS[:-1] and dropped == {"infra_error": 1}
    assert {s.stop_reason: s.reward for s in seqs} == {"submitted": 1.0, "max_turns": 1.0, "max_tokens": 0.0,
                                                       "timeout": 0.0, "format_error": 1.0}
    assert all(s.policy_version == 2 for s in seqs)
    assert seqs[0].mask == [0, 0, 1, 1] and seqs[0].behaviour_logp == [0.0, 0.0, -0.1, -0.2]


def test_dropping_on_purpose_and_graded_rewards():
    eps = [_episode(i, r) for i, r in enumerate(REASONS)]
    turns = [t for i in range(len(REASONS)) for t in _turns(i)]
    seqs, dropped = build_sequences(eps, turns, {"H": (1.0, 0, 1.0)}, drop_stop_reasons=["timeout", "max_tokens"],
                                    truncated_reward="graded")
    assert [s.stop_reason for s in seqs] == ["submitted", "max_turns", "format_error"]
    assert dropped == {"infra_error": 1, "timeout": 1, "max_tokens": 1}
    seqs, _ = build_sequences(eps[:4], turns, {"H": (1.0, 0, 1.0)}, truncated_reward="graded")
    assert [s.reward for s in seqs] == [1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="truncated_reward"):
        build_sequences(eps, turns, {"H": (1.0, 0, 1.0)}, truncated_reward="half")
