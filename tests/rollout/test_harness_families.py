"""Every shipped harness family driven by a scripted policy through the one engine, on workspace
and answer tasks in the bubblewrap sandbox: the actions run, observations come back, the loop
stops where the spec says, the verifier grades what the agent left behind, and the token and
read-span accounting holds."""

import json
import shutil

import pytest

from tasks.config import SandboxConfig
from tasks.harnesses.spec import load_harness
from tasks.records.suites.base import Task
from tasks.records.verifiers import register_verifier
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.generation import Generation
from tasks.rollout.turns import episode_prompts, prompt_lengths

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

HIDDEN = "HIDDEN-EXPECTED-CONTENT-7f3a"


@register_verifier("test_file_equals")
def _file_equals(spec, answer, ctx):
    """1.0 when the file holds the expected text (the hidden value is read only here)."""
    try:
        return float(ctx.sandbox().read_file(spec["path"]).decode().strip() == spec["expected"])
    except FileNotFoundError:
        return 0.0


class ScriptedPolicy:
    """Replies with script[turn] to every episode."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls, self.prompts = tokenizer, script, 0, []

    def generate(self, prompts, sampling, seed):
        text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        self.prompts.append(prompts)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids), "stop", text) for _ in prompts]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _task(files, expected, path="out.txt", setup=(), instruction="Write the greeting into out.txt."):
    t = Task(task_id="t/0", suite="test/ws", instruction=instruction, verifier_kind="test_file_equals",
             verifier_spec={"path": path, "expected": expected}, environment="workspace",
             workspace={"files": files, "setup": list(setup)})
    return t.to_row("train")


def _run(tok, harness, script, task, cfg=None):
    pol = ScriptedPolicy(tok, script)
    eps, turns = run_episodes(pol, load_harness(harness), [EpisodeJob("ep", {}, task, 0, 0)],
                              cfg or SandboxConfig(), seed=0)
    return eps[0], turns, pol


def _decoded_prompts(tok, pol):
    return [tok.decode(p) for batch in pol.prompts for p in batch]


def test_qwen_code_reads_edits_and_stops_on_a_plain_reply(tok):
    task = _task({"greet.txt": "hello\n"}, HIDDEN, setup=["cp greet.txt out.txt"])
    script = [
        '<tool_call>{"name": "read_file", "arguments": {"absolute_path": "/app/out.txt"}}</tool_call>',
        '<tool_call>{"name": "edit", "arguments": {"file_path": "/app/out.txt", "old_string": "hello", '
        f'"new_string": "{HIDDEN}"}}}}</tool_call>',
        "I replaced the greeting.",
    ]
    ep, turns, pol = _run(tok, "qwen-code-like", script, task)
    assert (ep["status"], ep["reward"], ep["num_turns"]) == ("ok", 1.0, 3)
    assert "<tool_response>" in turns[0]["observation"] and "1| hello" in turns[0]["observation"]
    assert "Edited out.txt" in turns[1]["observation"]
    spans = json.loads(turns[0]["read_spans"])
    file_span = [s for s in spans if s["source"] == "file"]
    assert file_span == [{"source": "file", "path": "out.txt", "tool": "read_file", "turn": 1,
                          "tokens": file_span[0]["tokens"], "start": file_span[0]["start"], "end": file_span[0]["end"],
                          "sha256": file_span[0]["sha256"]}]
    # the span's token positions are exactly the observation appended to the next prompt
    prompts = episode_prompts(turns)
    n0 = len(prompts[0]) + len(turns[0]["completion_token_ids"])
    assert (file_span[0]["start"], file_span[0]["end"]) == (n0, len(prompts[1]))
    assert prompts[1][:n0] == prompts[0] + turns[0]["completion_token_ids"]
    assert prompts == [p for batch in pol.prompts for p in batch]  # rebuilt = what the policy was given
    # the hidden expected value entered no prompt before the agent itself wrote it
    assert all(HIDDEN not in p for p in _decoded_prompts(tok, pol)[:2])


def test_swe_agent_bad_arguments_get_a_format_error_and_submit_ends(tok):
    task = _task({"a.txt": "x\n"}, "x")
    script = [
        '<tool_call>{"name": "view", "arguments": {"file": "a.txt"}}</tool_call>',
        '<tool_call>{"name": "create", "arguments": {"path": "out.txt", "content": "x"}}</tool_call>',
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
        "never reached",
    ]
    ep, turns, _ = _run(tok, "swe-agent-like", script, task)
    assert (ep["reward"], ep["num_turns"]) == (1.0, 3)
    assert turns[0]["observation"].startswith("Could not run the action: bad arguments for view")
    assert json.loads(turns[2]["action"])["calls"][0]["impl"] == "submit"


def test_openhands_runs_bash_and_python_and_a_plain_message_ends(tok):
    task = _task({}, "42")
    script = ["```bash\necho 40 > n.txt\n```", "```python\nn = int(open('n.txt').read())\nopen('out.txt','w').write(str(n + 2))\n"
              "print('wrote', n + 2)\n```", "I wrote the file."]
    ep, turns, _ = _run(tok, "openhands-like", script, task)
    assert (ep["reward"], ep["num_turns"]) == (1.0, 3)
    assert turns[0]["observation"] == "OBSERVATION (execute_bash):\n(no output)"
    assert turns[1]["observation"] == "OBSERVATION (execute_ipython_cell):\nwrote 42"


def test_aider_reflects_visible_test_failures_until_they_pass(tok):
    files = {"sol.py": "def add(a, b):\n    return 0\n",
             "test_sol.py": "from sol import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"}
    task = _task(files, "def add(a, b):\n    return a + b", path="sol.py")
    wrong = "sol.py\n```python\n<<<<<<< SEARCH\n    return 0\n=======\n    return a - b\n>>>>>>> REPLACE\n```"
    right = "sol.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```"
    ep, turns, pol = _run(tok, "aider-like", [wrong, right, "unused"], task, SandboxConfig(wall_s=20))
    assert (ep["status"], ep["reward"], ep["num_turns"]) == ("ok", 1.0, 2)
    assert turns[0]["observation"].startswith("The checks failed:") and "assert -1 == 5" in turns[0]["observation"]
    assert json.loads(turns[0]["action"])["reflect"]["exit_code"] != 0
    assert json.loads(turns[1]["action"])["reflect"] == {"status": "ok", "exit_code": 0}
    # aider shows the files in the first prompt, with a read span per file
    assert "def add(a, b):" in _decoded_prompts(tok, pol)[0]
    spans = json.loads(turns[0]["read_spans"])
    assert [s.get("path") for s in spans if s["source"] == "file"] == ["sol.py", "test_sol.py"]
    assert [s["tool"] for s in spans if s["source"] == "tool_output"] == ["reflect"]


def test_failed_setup_is_an_infra_error_not_a_zero(tok):
    task = _task({}, "x", setup=["exit 3"])
    ep, turns, _ = _run(tok, "openhands-like", ["```bash\ntrue\n```"], task)
    assert ep["status"] == "infra_error" and ep["success"] is False and turns == []


def test_context_budget_and_observation_truncation(tok, tmp_path):
    import yaml

    from tasks.harnesses.spec import SPEC_DIR

    data = yaml.safe_load(open(SPEC_DIR / "openhands-like.yaml"))
    data["context"] = {"observation_max_chars": 40, "truncation": "tail", "max_context_tokens": 900}
    data.update(name="oh-small", max_turns=40)
    p = tmp_path / "oh-small.yaml"
    p.write_text(yaml.safe_dump(data))
    task = _task({}, "x")
    pol = ScriptedPolicy(tok, ["```bash\nseq 1 500\n```"])
    eps, turns = run_episodes(pol, load_harness(p), [EpisodeJob("ep", {}, task, 0, 0)], SandboxConfig(), seed=0)
    obs = turns[0]["observation"]
    assert obs.endswith("500") and "characters cut]" in obs and "\n1\n" not in obs
    last = turns[-1]
    assert json.loads(last["action"]).get("context_limit") is True
    assert 2 < len(turns) < 40 and eps[0]["status"] == "ok"
    # every prompt stayed within the budget with room for a full reply
    assert all(n + 192 <= 900 for n in prompt_lengths(turns))


def test_the_policy_context_window_caps_the_budget(tok):
    task = _task({}, "x")

    class SmallWindow(ScriptedPolicy):
        max_model_len = 700

    pol = SmallWindow(tok, ["```bash\nseq 1 300\n```"])
    eps, turns = run_episodes(pol, load_harness("openhands-like"), [EpisodeJob("ep", {}, task, 0, 0)],
                              SandboxConfig(), seed=0)
    assert eps[0]["status"] == "ok" and json.loads(turns[-1]["action"]).get("context_limit") is True
    assert all(n + 192 <= 700 for n in prompt_lengths(turns))
    # a first prompt that cannot fit at all is an infrastructure error, not a zero
    pol = type("Tiny", (ScriptedPolicy,), {"max_model_len": 100})(tok, ["x"])
    eps, turns = run_episodes(pol, load_harness("openhands-like"), [EpisodeJob("ep", {}, task, 0, 0)],
                              SandboxConfig(), seed=0)
    assert (eps[0]["status"], turns) == ("infra_error", [])


def test_refused_paths_and_a_full_work_dir_come_back_as_tool_errors(tok):
    task = _task({}, "x", setup=["ln -s /etc/hostname link.txt"])
    script = [
        '<tool_call>{"name": "write_file", "arguments": {"file_path": "link.txt", "content": "x"}}</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": {"absolute_path": "/app"}}</tool_call>',
        '<tool_call>{"name": "run_shell_command", "arguments": {"command": "head -c 3000000 /dev/zero > fill"}}</tool_call>',
        '<tool_call>{"name": "write_file", "arguments": {"file_path": "more.txt", "content": "' + "y" * 5000 + '"}}</tool_call>',
        "done",
    ]
    ep, turns, _ = _run(tok, "qwen-code-like", script, task, SandboxConfig(workdir_mb=2))
    assert ep["status"] == "ok" and ep["num_turns"] == 5
    obs = [t["observation"].split("\n")[1] for t in turns[:4]]
    assert obs[0].startswith("Error:") and "link" in obs[0]  # a symlink is never followed
    assert obs[1].startswith("Error:")  # a folder is not a file
    assert obs[3].startswith("Error:") and "space" in obs[3].lower()  # the work dir is full


def test_episode_wall_limit_counts_environment_time_not_generation(tok, tmp_path):
    import time

    import yaml

    from tasks.harnesses.spec import SPEC_DIR

    data = yaml.safe_load(open(SPEC_DIR / "openhands-like.yaml"))
    data.update(name="oh-wall", limits={"episode_wall_s": 1.0})
    p = tmp_path / "oh-wall.yaml"
    p.write_text(yaml.safe_dump(data))

    class SlowPolicy(ScriptedPolicy):
        def generate(self, prompts, sampling, seed):
            time.sleep(0.8)  # slow sampling alone never ends an episode
            return super().generate(prompts, sampling, seed)

    task = _task({}, "x")
    eps, turns = run_episodes(SlowPolicy(tok, ["```bash\necho hi\n```"] * 3 + ["done"]), load_harness(p),
                              [EpisodeJob("ep", {}, task, 0, 0)], SandboxConfig(), seed=0)
    assert (eps[0]["status"], eps[0]["num_turns"]) == ("ok", 4)
    eps, turns = run_episodes(ScriptedPolicy(tok, ["```bash\nsleep 0.6\n```"]), load_harness(p),
                              [EpisodeJob("ep", {}, task, 0, 0)], SandboxConfig(), seed=0)
    assert (eps[0]["status"], eps[0]["num_turns"]) == ("timeout", 2)


@register_verifier("test_answer_equals")
def _answer_equals(spec, answer, ctx):
    """1.0 when the submitted answer is the expected one."""
    return float(answer == spec["expected"])


def test_react_python_records_each_tool_calls_exec_status(tok):
    """P6 counts tool errors from the sealed turns: a program that raises is 'error', one that
    runs is 'ok', and a turn without a tool call carries no status."""
    task = Task(task_id="a/0", suite="test/answer", instruction="What is 3 + 4?", verifier_kind="test_answer_equals",
                verifier_spec={"expected": "7"}, environment="answer").to_row("train")
    script = ["```python\nprint(1 / 0)\n```", "```python\nprint(3 + 4)\n```", "Answer: 7"]
    ep, turns, _ = _run(tok, "react-python", script, task)
    assert (ep["reward"], ep["num_turns"], ep["stop_reason"]) == (1.0, 3, "submitted")
    acts = [json.loads(t["action"]) for t in turns]
    assert [a.get("tool_status") for a in acts] == [["error"], ["ok"], None]
    assert "ZeroDivisionError" in turns[0]["observation"]
