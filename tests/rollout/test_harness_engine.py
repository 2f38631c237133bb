"""The harness engine with a scripted policy: parsing, the sandboxed tool, observations, token
accounting and grading, without model randomness."""

import json
import shutil

import pytest

from tasks.config import RunConfig, SandboxConfig
from tasks.harnesses.spec import load_harness
from tasks.records.freeze import freeze_tables
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.generation import Generation
from tasks.rollout.turns import episode_prompts
from tasks.train.sequences import build_sequences


class ScriptedPolicy:
    """Replies with a fixed script per turn (same for every episode)."""

    def __init__(self, tokenizer, script, finish="stop"):
        self.tokenizer, self.script, self.calls, self.finish, self.prompts = tokenizer, script, 0, finish, []

    def generate(self, prompts, sampling, seed):
        text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        self.prompts += [list(p) for p in prompts]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.finish == "stop":
            ids.append(self.tokenizer.eos_token_id)
        return [Generation(ids, [-0.5] * len(ids), self.finish, text) for _ in prompts]


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
    slots: list[int] = []
    eps, turns = run_episodes(pol, spec, [EpisodeJob("ep0", rec, task, 0, 0)], SandboxConfig(), seed=0,
                              on_turns=slots.append)
    ep = eps[0]
    assert (ep["status"], ep["reward"], ep["success"], ep["num_turns"], ep["final_answer"]) == ("ok", 1.0, True, 2, answer)
    # progress in turn slots (max_turns 3): none before turn 0, one for turn 0, then turn 1 and the
    # one slot the submitted episode no longer needs
    assert slots == [0, 1, 2] and sum(slots) == spec.max_turns
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
    assert ep["stop_reason"] == "submitted"
    seq = build_sequences([dict(ep, task_id=task["task_id"], task_hash=task["task_hash"], harness_id=spec.harness_id)],
                          turns, {spec.harness_id: (1.0, 0, 1.0)})[0][0]
    assert sum(seq.mask) == len(t0["completion_token_ids"]) + len(t1["completion_token_ids"])
    assert all(m == 0 for m in seq.mask[n0:n0 + len(obs_ids)])  # observation tokens never in the loss


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_each_turn_is_timed_by_the_engine_call_that_sampled_it(tiny_model_dir, task_and_record):
    """``turn_times``: per turn the start, end and batch size of its ``generate`` call (what the
    Inspect logs show); the tool step between two calls is outside both."""
    import time

    from transformers import AutoTokenizer

    task, rec = task_and_record
    answer = json.loads(task["verifier_spec"])["answer"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    calls = []

    class Slow(ScriptedPolicy):
        def generate(self, prompts, sampling, seed):
            t0 = time.time()
            time.sleep(0.2)
            out = super().generate(prompts, sampling, seed)
            calls.append((t0, time.time(), len(prompts)))
            return out

    pol = Slow(tok, [f"```python\nprint({answer})\n```", f"Answer: {answer}"])
    jobs = [EpisodeJob(f"ep{i}", rec, task, i, 0) for i in range(2)]
    eps, _ = run_episodes(pol, load_harness("react-python"), jobs, SandboxConfig(), seed=0)
    assert len(calls) == 2
    for ep in eps:
        times = ep["turn_times"]
        assert len(times) == ep["num_turns"] == 2 and [n for *_, n in times] == [2.0, 2.0]
        for (start, end, _), (c0, c1, _) in zip(times, calls):
            assert start <= c0 and c1 <= end and 0.2 <= end - start < c1 - c0 + 0.05
        assert times[1][0] >= times[0][1]  # the tool ran in between


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


@pytest.mark.parametrize("harness,script,finish,wall_s,want", [
    ("direct", ["Answer: {answer}"], "stop", None, "submitted"),
    ("direct", ["I do not know"], "stop", None, "format_error"),  # no answer to grade
    ("direct", ["Answer: {answer} and then some more wor"], "length", None, "max_tokens"),  # cut reply
    # out of turns: react-python-skill declares the last-number fallback, so its last reply's "1" is graded;
    # react-python declares none, so it ends with nothing to grade
    ("react-python-skill", ["```python\nprint(1)\n```"], "stop", None, "max_turns"),
    ("react-python", ["```python\nprint(1)\n```"], "stop", None, "format_error"),
    ("react-python", ["```python\nimport time; time.sleep(0.3)\n```"], "stop", 0.1, "timeout"),
])
def test_every_episode_says_why_it_stopped(tiny_model_dir, task_and_record, harness, script, finish, wall_s, want):
    from transformers import AutoTokenizer

    if harness != "direct" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    task, rec = task_and_record
    answer = json.loads(task["verifier_spec"])["answer"]
    spec = load_harness(harness)
    if wall_s is not None:
        spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"episode_wall_s": wall_s})})
    pol = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), [t.format(answer=answer) for t in script],
                         finish)
    eps, turns = run_episodes(pol, spec, [EpisodeJob("e", rec, task, 0, 0)], SandboxConfig(), seed=0)
    assert eps[0]["stop_reason"] == want
    assert (turns[-1]["finish_reason"] == "length") == (finish == "length")  # the cut turn is flagged
    if want == "max_turns" or (harness, want) == ("react-python", "format_error"):
        assert len(turns) == spec.max_turns
    if want in ("timeout", "max_tokens"):  # cut episodes keep their group place, scored 0 by default
        ep = dict(eps[0], task_id=task["task_id"], task_hash=task["task_hash"], harness_id=spec.harness_id)
        seqs, dropped = build_sequences([ep], turns, {spec.harness_id: (1.0, 0, 1.0)})
        assert len(seqs) == 1 and seqs[0].reward == 0.0 and seqs[0].stop_reason == want and dropped == {}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_each_tool_call_is_timed_with_its_exit_status_and_where_the_model_saw_it(tiny_model_dir, task_and_record):
    """``tool_calls``: per turn each call's start and end (between the engine calls around it),
    exec status and exit code, and where the turn's observation shows its text; a call whose text
    no observation showed (the last turn) keeps the text itself."""
    from transformers import AutoTokenizer

    task, rec = task_and_record
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    script = ["```python\nimport sys\nprint(7)\nsys.exit(3)\n```", "```python\nprint(8)\n```", "```python\nprint(9)\n```"]
    eps, turns = run_episodes(ScriptedPolicy(tok, script), load_harness("react-python"),
                              [EpisodeJob("ep0", rec, task, 0, 0)], SandboxConfig(), seed=0)
    ep = eps[0]
    calls, times = ep["tool_calls"], ep["turn_times"]
    assert [len(c) for c in calls] == [1, 1, 1] and ep["num_turns"] == 3
    assert [(c[0]["tool"], c[0]["status"], c[0]["exit_code"]) for c in calls] == [
        ("python", "error", 3), ("python", "ok", 0), ("python", "ok", 0)]
    for k in range(2):  # shown: the call's own text in the observation the model read next
        off, n = calls[k][0]["shown"]
        assert turns[k]["observation"][off:off + n] == f"Output:\n{7 + k}\n({2 - k} turns left)"
        assert "output" not in calls[k][0]
    assert turns[2]["observation"] == "" and "shown" not in calls[2][0] and calls[2][0]["output"] == "9"
    for k, c in enumerate(calls):  # each call ran after the engine call of its turn, before the next
        assert times[k][1] <= c[0]["start"] <= c[0]["end"]
        if k + 1 < len(times):
            assert c[0]["end"] <= times[k + 1][0]
