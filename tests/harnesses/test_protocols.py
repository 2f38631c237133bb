"""A harness owns its answer protocol (issue 49): each shipped answer harness reads its own format
and only that, the last-number fallback only where the spec declares it, several different answers
rejected where the spec says so, and demonstrations are checked against the protocol and hashed."""

import pytest
import yaml

from tasks.harnesses.actions import fallback_answer, parse_reply, protocol_answer
from tasks.harnesses.spec import SPEC_DIR, HarnessError, load_harness

# (harness, a reply in its protocol answering 7, a reply out of it that still says 7)
PROTOCOLS = [
    ("direct", "so the result is 7.\nAnswer: 7", "The result is 7."),
    ("answer-tag", "It is <answer>7</answer>", "Answer: 7"),
    ("answer-tag-1shot", "3 + 4 = 7.\n<answer>7</answer>", "3 + 4 = 7."),
    ("answer-tag-2shot", "<answer> 7 </answer>", "<answer>seven</answer> 7"),
    ("boxed", "3 + 4 = 7, so \\boxed{7}", "Answer: 7"),
    ("json-answer", '{"reasoning": "3 + 4", "answer": 7}', "Answer: 7"),
    ("think-answer", "<think>3 + 4 = 7</think>\nAnswer: 7", "<think>Answer: 7</think> so it is seven"),
    ("worked-answer", "3 + 4 = 7.\nAnswer: 7", "3 + 4 = 7."),
    ("calculator", "Answer: 7", "it is 7"),
    ("calculator-demo", "Answer: 7", "<result>7</result>"),
    ("react-python", "Answer: 7", "Output:\n7"),
    ("python-demo", "Answer: 7", "```python\nprint(7)\n```"),
]
# the only answer harnesses whose protocol includes the last number of the reply (all others: none)
DECLARED_FALLBACK = {"direct", "react-python-skill", "react-python-skill-file", "openhands-like", "qwen-code-like",
                     "swe-agent-like", "talkmesh"}


@pytest.mark.parametrize("harness,own,other", PROTOCOLS)
def test_a_reply_in_protocol_parses_and_one_out_of_it_does_not(harness, own, other):
    spec = load_harness(harness)
    assert parse_reply(spec, own).answer == "7"
    assert parse_reply(spec, other).answer is None
    # the out-of-protocol reply still holds the number 7: only a declared fallback reads it
    assert fallback_answer(spec, other) == ("7" if harness == "direct" else None)


def test_the_last_number_fallback_is_declared_by_exactly_the_listed_harnesses():
    from tasks.harnesses.spec import shipped_harnesses

    got = {n for n in shipped_harnesses() if load_harness(n).stop.answer_fallback == "last_number"}
    assert got == DECLARED_FALLBACK
    # every format harness of the harness table grades only its protocol
    for h, *_ in PROTOCOLS[1:]:
        assert load_harness(h).stop.answer_fallback == "none", h


@pytest.mark.parametrize("harness,reply,want", [
    ("answer-tag", "<answer>3</answer> or <answer>4</answer>", None),     # a shotgun of tags: out of protocol
    ("answer-tag", "<answer>4</answer> ... <answer>4</answer>", "4"),      # the same answer twice is one answer
    ("boxed", "\\boxed{12} \\boxed{13} \\boxed{14}", None),
    ("calculator-demo", "Answer: 5\nAnswer: 6", None),
    ("direct", "Answer: 5\nAnswer: 6", "5"),                              # direct keeps the first (declared)
])
def test_several_different_answers_are_handled_as_the_harness_declares(harness, reply, want):
    spec = load_harness(harness)
    assert protocol_answer(spec, reply) == want
    if want is None:  # rejected: neither parsed nor read by a fallback
        assert parse_reply(spec, reply).answer is None and fallback_answer(spec, reply) is None


def test_an_agent_loop_answers_only_through_its_submit_tool():
    spec = load_harness("agent-submit")
    sub = parse_reply(spec, 'Thought: done.\n<tool_call>\n{"name": "submit", "arguments": {"answer": "7"}}\n</tool_call>')
    assert [c.impl for c in sub.calls] == ["submit"] and sub.calls[0].args == {"answer": "7"}
    assert parse_reply(spec, "Answer: 7").answer is None and fallback_answer(spec, "Answer: 7") is None


def _spec_data(name):
    return yaml.safe_load((SPEC_DIR / f"{name}.yaml").read_text())


def _load(tmp_path, data):
    p = tmp_path / "h.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_harness(p)


def test_demonstrations_are_part_of_the_hash_and_absent_ones_leave_it_alone(tmp_path):
    base = _spec_data("answer-tag")
    plain = _load(tmp_path, base)
    assert plain.harness_id == load_harness("answer-tag").harness_id and "demonstrations" not in plain.spec_dict()
    demo = {"messages": [{"role": "user", "content": "Problem: 2 + 2?"},
                         {"role": "assistant", "content": "<answer>4</answer>"}]}
    one = _load(tmp_path, {**base, "demonstrations": [demo]})
    assert one.harness_id != plain.harness_id and one.spec_dict()["demonstrations"] == [demo]
    other = {"messages": [demo["messages"][0], {"role": "assistant", "content": "<answer>5</answer>"}]}
    assert _load(tmp_path, {**base, "demonstrations": [other]}).harness_id != one.harness_id  # the text is hashed
    assert one.chat_messages() == demo["messages"]


@pytest.mark.parametrize("harness,demos,msg", [
    ("answer-tag", [{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}],
     "submits no answer under stop.answer_pattern"),
    ("answer-tag", [{"messages": [{"role": "assistant", "content": "<answer>4</answer>"},
                                  {"role": "user", "content": "ok"}]}], "must be 'user'"),
    ("answer-tag", [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<answer>1</answer>"},
                                  {"role": "user", "content": "b"}]}], "ends with the assistant"),
    ("answer-tag", [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
                                  {"role": "user", "content": "b"}, {"role": "assistant", "content": "<answer>1</answer>"}]}],
     "single_turn harness's demonstration is one user turn"),
    ("calculator", [{"messages": [{"role": "user", "content": "2 * 3?"}, {"role": "assistant", "content": "let me see"},
                                  {"role": "user", "content": "6"}, {"role": "assistant", "content": "Answer: 6"}]}],
     r"messages\[1\] is not a function_call action"),
])
def test_a_demonstration_outside_the_protocol_is_refused_on_load(tmp_path, harness, demos, msg):
    with pytest.raises(HarnessError, match=msg):
        _load(tmp_path, {**_spec_data(harness), "demonstrations": demos})


def test_the_tool_demonstrations_show_a_call_and_its_observation():
    from tasks.harnesses.tools import evaluate_arithmetic

    for name in ("calculator-demo", "python-demo", "agent-submit"):
        spec = load_harness(name)
        for d in spec.demonstrations:
            call = parse_reply(spec, d.messages[1].content).calls[0]
            expr = call.args.get("expression") or call.args["code"].strip().removeprefix("print(").removesuffix(")")
            # the observation the demonstration shows is what the tool returns for that call
            assert str(evaluate_arithmetic(expr)) in d.messages[2].content, (name, expr)
