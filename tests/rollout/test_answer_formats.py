"""Format apart from competence: each answer-format harness parses its own format, marks an answer
read by the fallback as not parsed, and the calculator tool computes arithmetic and nothing else."""

import json

import pytest

from tasks.config import RunConfig, SandboxConfig
from tasks.harnesses.actions import parse_reply
from tasks.harnesses.spec import load_harness
from tasks.harnesses.tools import evaluate_arithmetic
from tasks.records.freeze import freeze_tables
from tasks.rollout.harness import EpisodeJob, run_episodes
from tests.rollout.test_harness_engine import ScriptedPolicy


@pytest.mark.parametrize("harness,own,other", [
    ("direct", "so the result is 7.\nAnswer: 7", "The result is 7."),
    ("answer-tag", "It is <answer>7</answer>", "Answer: 7"),
    ("json-answer", '{"reasoning": "3 + 4", "answer": 7}', "Answer: 7"),
    ("json-answer", '{"reasoning": "3 + 4", "answer": "7"}', "the answer is 7"),
    ("boxed", "3 + 4 = 7, so \\boxed{7}", "Answer: 7"),
    ("think-answer", "<think>3 + 4 = 7</think>\nAnswer: 7", "<think>Answer: 7</think> so it is seven"),
    ("calculator", "Answer: 7", "it is 7"),
])
def test_each_harness_reads_its_own_format_and_only_that(harness, own, other):
    spec = load_harness(harness)
    assert parse_reply(spec, own).answer == "7"
    assert parse_reply(spec, other).answer is None  # the fallback may still read 7; parsing does not


def test_calculator_evaluates_arithmetic_and_refuses_everything_else():
    assert evaluate_arithmetic("( -9 / 9 ) * 3") == -3 and isinstance(evaluate_arithmetic("6 / 3"), int)
    assert evaluate_arithmetic("7 // 2 + 2 ** 3 - 5 % 3") == 9
    assert evaluate_arithmetic("1 / 4") == 0.25 and evaluate_arithmetic("2^3") == 8
    for bad, why in [("__import__('os').system('id')", "Call"), ("open('x')", "Call"), ("a + 1", "Name"),
                     ("(1).real", "Attribute"), ("[1, 2]", "List"), ("9 ** 9 ** 9", "exponent above 64"),
                     ("10 ** 20", "out of range"), ("1 / 0", "division by zero"), ("1 +", "not an arithmetic"),
                     ("1" * 201, "longer than 200"), ("'a' * 3", "Constant")]:
        with pytest.raises(ValueError, match=why):
            evaluate_arithmetic(bad)


@pytest.fixture(scope="module")
def task_and_records():
    cfg = RunConfig(name="e", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11, "reward": "exact"}],
                    harnesses=["calculator", "direct"])
    tasks, _, records = freeze_tables(cfg)
    return tasks[0], {r["harness_name"]: r for r in records if r["task_id"] == tasks[0]["task_id"]}


def test_a_calculator_episode_calls_the_tool_sees_the_result_and_parses_its_answer(tiny_model_dir, task_and_records):
    from transformers import AutoTokenizer

    task, recs = task_and_records
    answer = json.loads(task["verifier_spec"])["answer"]
    expr = json.loads(task["metadata"])["expression"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "%s"}}\n</tool_call>' % expr
    pol = ScriptedPolicy(tok, [call, f"Answer: {answer}"])
    eps, turns = run_episodes(pol, load_harness("calculator"), [EpisodeJob("c", recs["calculator"], task, 0, 0)],
                              SandboxConfig(), seed=0)
    assert (eps[0]["reward"], eps[0]["num_turns"], eps[0]["answer_parsed"]) == (1.0, 2, True)
    assert turns[0]["observation"] == f"<tool_response>\n{answer}\n</tool_response>"


@pytest.mark.parametrize("reply,parsed,reward", [
    ("Answer: {answer}", True, 1.0),          # the harness's own format, right
    ("Answer: {wrong}", True, 0.0),           # its own format, wrong
    ("I think it is {answer}", False, 1.0),   # right by the fallback: graded, but not parsed
    ("no number", False, 0.0),                # nothing to grade
])
def test_every_graded_episode_says_whether_its_answer_was_parsed(tiny_model_dir, task_and_records, reply, parsed,
                                                                  reward):
    from transformers import AutoTokenizer

    task, recs = task_and_records
    answer = json.loads(task["verifier_spec"])["answer"]
    wrong = str(int(float(answer)) + 1)
    pol = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), [reply.format(answer=answer, wrong=wrong)])
    eps, _ = run_episodes(pol, load_harness("direct"), [EpisodeJob("d", recs["direct"], task, 0, 0)],
                          SandboxConfig(), seed=0)
    assert (eps[0]["answer_parsed"], eps[0]["reward"]) == (parsed, reward)


@pytest.fixture(scope="module")
def demo_task():
    cfg = RunConfig(name="e", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11, "reward": "exact"}],
                    harnesses=["answer-tag", "answer-tag-1shot"])
    tasks, _, records = freeze_tables(cfg)
    return tasks[0], {r["harness_name"]: r for r in records if r["task_id"] == tasks[0]["task_id"]}


def test_demonstrations_are_in_the_prompt_the_model_sees(tiny_model_dir, demo_task):
    from transformers import AutoTokenizer

    from tasks.rollout.generation import ChatFormat

    task, recs = demo_task
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain, shot = load_harness("answer-tag"), load_harness("answer-tag-1shot")
    seen, spans = {}, {}
    for spec in (plain, shot):
        pol = ScriptedPolicy(tok, ["<answer>1</answer>"])
        _, turns = run_episodes(pol, spec, [EpisodeJob("d", recs[spec.name], task, 0, 0)], SandboxConfig(), seed=0)
        seen[spec.name] = pol.prompts[0]
        spans[spec.name] = [(s["source"], s.get("role")) for s in json.loads(turns[0]["read_spans"])]
    # the read spans say the demonstration entered the context at turn 0
    assert spans["answer-tag-1shot"] == [("system", None), ("demonstration", "user"), ("demonstration", "assistant"),
                                         ("instruction", None)]
    assert spans["answer-tag"] == [("system", None), ("instruction", None)]
    user = "Problem: " + task["instruction"]
    chat = ChatFormat(tok)
    # token for token: system, the demonstration's user and assistant turns, then the task
    assert seen["answer-tag-1shot"] == chat.initial(shot.render_system(), user, shot.chat_messages())
    assert seen["answer-tag"] == chat.initial(plain.render_system(), user)
    demo_reply = shot.demonstrations[0].messages[1].content
    ids = tok.encode(demo_reply, add_special_tokens=False)
    p = seen["answer-tag-1shot"]
    assert any(p[i:i + len(ids)] == ids for i in range(len(p) - len(ids) + 1))
    assert len(p) > len(seen["answer-tag"]) and demo_reply not in tok.decode(seen["answer-tag"])
    # the demonstration comes before the task
    assert tok.decode(p).index(demo_reply) < tok.decode(p).index(task["instruction"])


@pytest.mark.parametrize("harness,reply,parsed,reward", [
    ("answer-tag-1shot", "<answer>{answer}</answer>", True, 1.0),
    ("answer-tag-1shot", "It is {answer}.", False, 0.0),                     # out of protocol: no fallback
    ("answer-tag-1shot", "<answer>{answer}</answer> <answer>{wrong}</answer>", False, 0.0),  # several tags
    ("answer-tag-1shot", "17 + 26 = 43.\n<answer>43</answer>", True, 0.0),   # the demonstration echoed back
    ("answer-tag", "{instruction} <answer>", False, 0.0),                    # the prompt copied, numbers and all
    ("direct", "{instruction}", False, None),                               # direct's fallback reads only the reply
])
def test_cheating_replies_are_graded_as_the_harness_defines(tiny_model_dir, demo_task, harness, reply, parsed, reward):
    from transformers import AutoTokenizer

    from tasks.harnesses.actions import fallback_answer

    task, recs = demo_task
    answer = json.loads(task["verifier_spec"])["answer"]
    rec = recs.get(harness) or dict(recs["answer-tag"], harness_name=harness)
    text = reply.format(answer=answer, wrong=str(int(float(answer)) + 1), instruction=task["instruction"])
    spec = load_harness(harness)
    pol = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), [text])
    eps, _ = run_episodes(pol, spec, [EpisodeJob("c", rec, task, 0, 0)], SandboxConfig(), seed=0)
    assert eps[0]["answer_parsed"] is parsed
    if reward is None:  # direct: graded by the last number of the reply, which here is the prompt's last number
        assert eps[0]["final_answer"] == fallback_answer(spec, text) and not eps[0]["answer_parsed"]
    else:
        assert eps[0]["reward"] == reward
        assert (eps[0]["final_answer"] is None) == (not parsed)
