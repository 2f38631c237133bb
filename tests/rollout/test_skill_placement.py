"""P2 (BiPA): a skill placed as a file is read only by an action, so skill-read coverage and turns
to first read measure what the agent did; a skill in the system prompt is read at turn 0 by
construction. The engine runs with a scripted policy in the bubblewrap sandbox."""

import json

import pytest

from tasks.bipa.graph import graph_metrics
from tasks.config import RunConfig, SandboxConfig
from tasks.harnesses.spec import HarnessSpec, load_harness
from tasks.rollout.harness import EpisodeJob, read_skill, run_episodes
from tasks.rollout.turns import episode_prompts
from tasks.rollout.generation import Generation
from tests.facilities import bwrap_missing, require


class Script:
    """Replies ``script[turn]`` to every episode (turn = call count)."""

    def __init__(self, tok, script):
        self.tokenizer, self.script, self.calls = tok, script, 0

    def generate(self, prompts, sampling, seed):
        text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids), "stop", text) for _ in prompts]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    from transformers import AutoTokenizer

    cfg = RunConfig(name="s", suites=[{"name": "basic_arithmetic", "size": 2, "seed": 4}],
                    harnesses=["react-python-skill-file"])
    from tasks.records.freeze import freeze_tables

    tasks, _, records = freeze_tables(cfg)
    return AutoTokenizer.from_pretrained(tiny_model_dir), tasks[0], records[0]


def _run(setup, spec, script):
    tok, task, rec = setup
    answer = json.loads(task["verifier_spec"])["answer"]
    pol = Script(tok, [s.format(answer=answer) for s in script])
    eps, turns = run_episodes(pol, spec, [EpisodeJob("ep", rec, task, 0, 0)], SandboxConfig(), seed=0)
    return tok, eps[0], turns


def _spans(turns):
    return [s for t in turns for s in json.loads(t["read_spans"])]


def test_a_file_skill_is_not_in_the_prompt_and_is_read_by_an_action(setup):
    require("bubblewrap", bwrap_missing())
    spec = load_harness("react-python-skill-file")
    tok, ep, turns = _run(setup, spec, ["First the procedure.\n```bash\ncat SKILL.md\n```", "Answer: {answer}"])
    assert ep["status"] == "ok" and ep["success"] and ep["num_turns"] == 2
    skill_line = spec.skill.splitlines()[0]
    assert skill_line not in tok.decode(episode_prompts(turns)[0])  # not in the first prompt
    assert skill_line in turns[0]["observation"]  # the file's text came back from the action
    skill = [s for s in _spans(turns) if s["source"] == "skill"]
    assert len(skill) == 1 and skill[0]["turn"] == 1 and skill[0]["tool"] == "bash"
    assert skill[0]["tokens"] == len(tok.encode(spec.skill, add_special_tokens=False))
    m = graph_metrics(turns, "seed", "fresh")
    assert m["episode_skill_coverage"] == 1.0 and m["mean_turns_to_first_skill_read"] == 1.0
    assert m["turn_skill_coverage"] == 0.5  # turn 0's context did not hold it, turn 1's did


def test_a_file_skill_never_read_gives_zero_coverage(setup):
    require("bubblewrap", bwrap_missing())
    spec = load_harness("react-python-skill-file")
    _, ep, turns = _run(setup, spec, ["```python\nprint(6 * 7)\n```", "Answer: {answer}"])
    assert ep["num_turns"] == 2 and not [s for s in _spans(turns) if s["source"] == "skill"]
    m = graph_metrics(turns, "seed", "fresh")
    assert m["episode_skill_coverage"] == 0.0 and m["mean_turns_to_first_skill_read"] is None
    assert m["skill_input_tokens_per_episode"] == 0.0


def test_python_that_prints_the_skill_and_a_read_file_tool_both_count(setup):
    require("bubblewrap", bwrap_missing())
    spec = load_harness("react-python-skill-file")
    _, _, turns = _run(setup, spec, ["```python\nx = 1\n```", "```python\nprint(open('SKILL.md').read())\n```",
                                     "Answer: {answer}"])
    assert [s["turn"] for s in _spans(turns) if s["source"] == "skill"] == [2]
    assert graph_metrics(turns, "a", "b")["mean_turns_to_first_skill_read"] == 2.0
    # a function-call harness reading the file with its read_file tool (files_read, line-numbered text)
    q = load_harness("qwen-code-like").spec_dict()
    q.update(name="qwen-skill-file", skill="1. Add the numbers.\n2. Answer.", skill_placement="file")
    qspec = HarnessSpec.model_validate(q)
    call = '<tool_call>{{"name": "read_file", "arguments": {{"absolute_path": "/app/SKILL.md"}}}}</tool_call>'
    tok, ep, turns = _run(setup, qspec, [call, "Answer: {answer}"])
    spans = _spans(turns)
    assert [(s["source"], s["turn"], s["path"]) for s in spans if s["source"] in ("skill", "file")] == [
        ("skill", 1, "SKILL.md")]
    assert "Add the numbers" not in tok.decode(episode_prompts(turns)[0])
    assert "Add the numbers" in tok.decode(episode_prompts(turns)[1])


def test_a_system_prompt_skill_is_read_at_turn_zero_by_construction(setup):
    require("bubblewrap", bwrap_missing())
    spec = load_harness("react-python-skill")
    tok, _, turns = _run(setup, spec, ["```python\nprint(1)\n```", "Answer: {answer}"])
    assert spec.skill.splitlines()[0] in tok.decode(episode_prompts(turns)[0])
    assert [s["turn"] for s in _spans(turns) if s["source"] == "skill"] == [0]
    m = graph_metrics(turns, "seed", "fresh")
    assert m["episode_skill_coverage"] == 1.0 and m["mean_turns_to_first_skill_read"] == 0.0


def test_read_skill_rule_and_spec_validation():
    spec = load_harness("react-python-skill-file")
    assert read_skill(spec, ("SKILL.md",), "1 | whatever") and read_skill(spec, ("./SKILL.md",), "")
    assert read_skill(spec, (), "Output:\n" + spec.skill[:130] + "\n[...cut]")  # a cut observation still holds the opening
    assert not read_skill(spec, ("other.md",), "3. Read the printed number")  # a later line alone is not a read
    assert not read_skill(load_harness("react-python-skill"), ("SKILL.md",), load_harness("react-python-skill").skill)
    # the placement fields are left out of the hash at their defaults: shipped harness ids did not change
    assert "skill_placement" not in load_harness("react-python-skill").spec_dict()
    assert spec.spec_dict()["skill_placement"] == "file" and "## Skill" not in spec.render_system()
    base = load_harness("react-python-skill").spec_dict()
    for bad, needle in ((dict(skill=None, skill_placement="file"), "needs a skill"),
                        (dict(skill_placement="file", tools=[]), "tool that can read"),
                        (dict(skill_placement="file", skill_path="../x.md"), "skill_path")):
        with pytest.raises(Exception, match=needle):
            HarnessSpec.model_validate({**base, **bad})
    direct = load_harness("direct").spec_dict()
    with pytest.raises(Exception, match="multi-turn"):
        HarnessSpec.model_validate({**direct, "skill": "x", "skill_placement": "file"})
