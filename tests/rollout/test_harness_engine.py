"""The harness engine with a scripted policy: parsing, the sandboxed tool, observations, token
accounting and grading, without model randomness."""

import json
import shutil

import pytest

from tasks.config import RunConfig, SandboxConfig
from tasks.harnesses.spec import load_harness
from tasks.records.freeze import freeze_tables
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.policy import Generation
from tasks.rollout.turns import episode_prompts
from tasks.train.sequences import build_sequences


class ScriptedPolicy:
    """Replies with a fixed script per turn (same for every episode)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls, self.prompts = tokenizer, script, 0, []

    def generate(self, prompts, sampling, seed):
        text = self.script[self.calls]
        self.calls += 1
        self.prompts += [list(p) for p in prompts]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids), "stop", text) for _ in prompts]


@pytest.fixture(scope="module")
def task_and_record():
    cfg = RunConfig(name="e", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11}], harnesses=["react-python"])
    tasks, _, records = freeze_tables(cfg)
    return tasks[0], records[0]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_react_episode_runs_code_observes_and_is_graded(tiny_model_dir, task_and_record):
    from transformers import AutoTokenizer

    task, rec = task_and_record
    answer = json.loads(task["verifier_spec"])["answer"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = load_harness("react-python")
    pol = ScriptedPolicy(tok, [f"Let me compute.\n```python\nprint({answer} * 1)\n```", f"Answer: {answer}"])
    eps, turns = run_episodes(pol, spec, [EpisodeJob("ep0", rec, task, 0, 0)], SandboxConfig(), seed=0)
    ep = eps[0]
    assert (ep["status"], ep["reward"], ep["success"], ep["num_turns"], ep["final_answer"]) == ("ok", 1.0, True, 2, answer)
    t0, t1 = turns
    assert str(int(float(answer))) in t0["observation"]
    assert t0["observation"].endswith("(2 turns left)")  # max_turns 3, one used
    # token-exact accounting: turn 1's prompt extends turn 0's prompt + completion
    p0, p1 = episode_prompts(turns)
    n0 = len(p0) + len(t0["completion_token_ids"])
    assert p1[:n0] == p0 + t0["completion_token_ids"]
    obs_ids = p1[n0:]
    assert t1["prompt_continues"] and t1["prompt_added_ids"] == obs_ids  # turn 1 stores only what it adds
    assert pol.prompts == [p0, p1]  # the rebuilt prompts are what the policy was given
    assert str(int(float(answer))) in tok.decode(obs_ids)
    spans = json.loads(t0["read_spans"])
    assert [s["source"] for s in spans] == ["system", "instruction", "tool_output"]
    # the hidden answer never entered a prompt before the agent produced it
    assert f"answer\":\"{answer}" not in tok.decode(p0)
    seq = build_sequences([dict(ep, task_id=task["task_id"], task_hash=task["task_hash"], harness_id=spec.harness_id)],
                          turns, {spec.harness_id: (1.0, 0, 1.0)})[0]
    assert sum(seq.mask) == len(t0["completion_token_ids"]) + len(t1["completion_token_ids"])
    assert all(m == 0 for m in seq.mask[n0:n0 + len(obs_ids)])  # observation tokens never in the loss


def test_direct_episode_falls_back_to_the_last_number(tiny_model_dir, task_and_record):
    from transformers import AutoTokenizer

    task, rec = task_and_record
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    answer = json.loads(task["verifier_spec"])["answer"]
    pol = ScriptedPolicy(tok, [f"I think it is 3, no, {answer}"])
    eps, turns = run_episodes(pol, load_harness("direct"), [EpisodeJob("e", rec, task, 0, 0)], SandboxConfig(), seed=0)
    assert eps[0]["final_answer"] == answer and eps[0]["reward"] == 1.0 and len(turns) == 1
    pol = ScriptedPolicy(tok, ["no number here"])
    eps, _ = run_episodes(pol, load_harness("direct"), [EpisodeJob("e", rec, task, 0, 0)], SandboxConfig(), seed=0)
    assert eps[0]["final_answer"] is None and eps[0]["reward"] == 0.0 and eps[0]["status"] == "ok"
