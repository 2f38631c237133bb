"""Real suite tasks (Terminal-Bench format, HumanEval, MiniWoB++) through shipped harnesses and the
one engine, with scripted policies that act as a capable agent would: the visible workspace is set
up, the agent's actions change it, and the suite's own verifier grades what is left, with the
hidden tests copied in only then."""

import base64
import json
import re

import pytest

from tasks.config import SandboxConfig, SuiteConfig
from tasks.harnesses.spec import load_harness
from tasks.records.suites import load_suite
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.generation import Generation
from tests.facilities import bwrap_missing, require, require_chromium


class ReadingPolicy:
    """Replies with ``reply(turn, decoded prompt)``; records the prompts it saw."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.turn, self.seen = tokenizer, reply, 0, []

    def generate(self, prompts, sampling, seed):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            self.seen.append(text)
            reply = self.reply(self.turn, text)
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.1] * len(ids), "stop", reply))
        self.turn += 1
        return out


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _one(source, name, task_id, **kw):
    tasks = load_suite(SuiteConfig(source=source, name=name, size=kw.pop("size", 100)))
    return next(t for t in tasks if t.task_id == task_id).to_row("test")


def _run(policy, harness, task, cfg=None):
    eps, turns = run_episodes(policy, load_harness(harness), [EpisodeJob("e", {}, task, 0, 0)],
                              cfg or SandboxConfig(wall_s=20), seed=0)
    return eps[0], turns


def test_terminal_task_solved_through_openhands_bash_and_graded_by_hidden_tests(tok):
    require("bubblewrap", bwrap_missing())
    task = _one("terminal_bench", "builtin", "builtin/word-frequency")
    oracle = json.loads(task["verifier_spec"])["oracle"]
    script = base64.b64decode(oracle["files_b64"][oracle["entry"]]).decode()
    pol = ReadingPolicy(tok, lambda t, _: f"```bash\n{script}\n```" if t == 0 else "<finish>done</finish>")
    ep, turns = _run(pol, "openhands-like", task)
    assert (ep["status"], ep["reward"], ep["num_turns"]) == ("ok", 1.0, 2)
    # hidden tests never entered the agent's view: not in a prompt, not in the work dir it listed
    tests = json.loads(task["verifier_spec"])["tests"]
    assert "def test_" not in "".join(pol.seen)
    # a do-nothing agent gets partial credit at most, graded by the same hidden tests
    ep0, _ = _run(ReadingPolicy(tok, lambda t, _: "<finish>nothing</finish>"), "openhands-like", task)
    assert ep0["status"] == "ok" and ep0["reward"] < 1.0 and tests


def test_humaneval_through_qwen_code_write_file(tok):
    require("bubblewrap", bwrap_missing())
    task = _one("humaneval", "HumanEval", "HumanEval/2", size=3)
    spec = json.loads(task["verifier_spec"])
    prompt = json.loads(task["workspace"])["files"]["solution.py"]
    code = json.dumps(prompt + spec["canonical_solution"])
    call = f'<tool_call>{{"name": "write_file", "arguments": {{"file_path": "/app/solution.py", "content": {code}}}}}</tool_call>'
    ep, turns = _run(ReadingPolicy(tok, lambda t, _: call if t == 0 else "Done."), "qwen-code-like", task)
    assert (ep["reward"], ep["num_turns"]) == (1.0, 2)
    assert "def test_" not in "".join(t["completion_text"] + t["observation"] for t in turns)
    ep, _ = _run(ReadingPolicy(tok, lambda t, _: "Done."), "qwen-code-like", task)
    assert ep["reward"] == 0.0  # the untouched stub fails the hidden check


def test_humaneval_through_aider_doctest_reflection(tok):
    require("bubblewrap", bwrap_missing())
    task = _one("humaneval", "HumanEval", "HumanEval/2", size=3)
    spec = json.loads(task["verifier_spec"])
    body = spec["canonical_solution"].rstrip("\n")
    prompt = json.loads(task["workspace"])["files"]["solution.py"]
    last = "\n".join(prompt.rstrip("\n").split("\n")[-2:])  # the last doctest line and the docstring's end
    assert prompt.count(last) == 1
    wrong = f"solution.py\n```python\n<<<<<<< SEARCH\n{last}\n=======\n{last}\n    return 0.0\n>>>>>>> REPLACE\n```"
    right = f"solution.py\n```python\n<<<<<<< SEARCH\n    return 0.0\n=======\n{body}\n>>>>>>> REPLACE\n```"
    ep, turns = _run(ReadingPolicy(tok, lambda t, _: [wrong, right][min(t, 1)]), "aider-like", task)
    assert (ep["reward"], ep["num_turns"]) == (1.0, 2)
    assert "The checks failed" in turns[0]["observation"] and "Failed example" in turns[0]["observation"]


def test_miniwob_click_button_through_web_react(tok):
    require_chromium()
    task = load_suite(SuiteConfig(source="miniwob", name="click-button", size=1))[0].to_row("test")
    target = re.search(r'Click on the "(.+?)" button', task["instruction"]).group(1)

    def reply(turn, prompt):
        ref = re.findall(rf'\[(\d+)\] button[^\n]*"{re.escape(target)}"', prompt)[-1]
        return f"<click><ref>{ref}</ref></click>"

    pol = ReadingPolicy(tok, reply)
    ep, turns = _run(pol, "web-react", task)
    assert (ep["status"], ep["reward"], ep["num_turns"]) == ("ok", 1.0, 1)
    assert f'"{target}"' in pol.seen[0]  # the page rendering was the first observation


@pytest.mark.parametrize("harness, reply", [
    ("qwen-code-like", "The expression is 94*4 - 61 - 6.\nAnswer: 94*4 - 61 - 6"),
    ("swe-agent-like", '<tool_call>{"name": "submit", "arguments": {"answer": "94*4 - 61 - 6"}}</tool_call>'),
    ("openhands-like", "<finish>94*4 - 61 - 6</finish>"),
])
def test_countdown_expressions_are_submitted_whole_and_scored_by_reasoning_gym(tok, harness, reply):
    task = next(t for t in load_suite(SuiteConfig(source="reasoning_gym", name="countdown", size=3, seed=1))
                if "309" in t.instruction).to_row("test")
    ep, _ = _run(ReadingPolicy(tok, lambda t, _: reply), harness, task)
    assert (ep["final_answer"], ep["reward"]) == ("94*4 - 61 - 6", 1.0)
    ep, _ = _run(ReadingPolicy(tok, lambda t, _: reply.replace("94*4", "94*3")), harness, task)
    assert ep["reward"] < 1.0
