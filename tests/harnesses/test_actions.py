"""Each action format's parser on replies a model could write, well-formed and not."""

import pytest

from tasks.harnesses.actions import fallback_answer, last_code_block, parse_reply
from tasks.harnesses.spec import load_harness


def test_function_call_in_tool_call_tags_maps_arguments_to_the_implementation():
    q = load_harness("qwen-code-like")
    r = parse_reply(q, 'I will look.\n<tool_call>\n{"name": "edit", "arguments": {"file_path": "/app/a.py", '
                       '"old_string": "x = 1", "new_string": "x = 2"}}\n</tool_call>')
    assert r.error is None and r.answer is None
    assert [(c.tool, c.impl, c.args) for c in r.calls] == [
        ("edit", "str_replace", {"path": "/app/a.py", "old": "x = 1", "new": "x = 2"})]


def test_function_call_errors_name_the_problem():
    q = load_harness("qwen-code-like")
    assert "unknown tool 'rm'" in parse_reply(q, '<tool_call>{"name": "rm", "arguments": {}}</tool_call>').error
    err = parse_reply(q, '<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>').error
    assert err.startswith("bad arguments for read_file") and "absolute_path" in err
    assert "no JSON object" in parse_reply(q, "<tool_call>read the file</tool_call>").error
    # plain text with no call is not an error: it is a reply without an action
    r = parse_reply(q, "All done. Answer: 42")
    assert r.calls == [] and r.error is None and r.answer == "42"


def test_function_call_as_bare_json_and_swe_agent_submit():
    s = load_harness("swe-agent-like")
    r = parse_reply(s, 'Done: {"name": "submit", "arguments": {"answer": "17"}}')
    assert [(c.impl, c.args) for c in r.calls] == [("submit", {"answer": "17"})]
    r = parse_reply(s, '{"name": "view", "arguments": {"path": "a.py", "start_line": 0}}')
    assert r.calls == [] and "start_line" in r.error  # minimum 1 in the schema


def test_xml_tags_with_child_parameters_and_integer_coercion():
    w = load_harness("web-react")
    r = parse_reply(w, "Now type.\n<type><ref>5</ref><text>hello world</text></type> then <click><ref>2</ref></click>")
    assert [(c.tool, c.args) for c in r.calls] == [("type", {"ref": "5", "text": "hello world"})]
    assert "<click> is never closed" == parse_reply(w, "<click><ref>3</ref>").error


def test_fenced_code_picks_the_tool_by_language():
    o = load_harness("openhands-like")
    r = parse_reply(o, "Let me list.\n```bash\nls -la\n```\nand\n```python\nprint(1)\n```")
    assert [(c.tool, c.args) for c in r.calls] == [("execute_bash", {"command": "ls -la"})]
    r = parse_reply(o, "```python\nprint(2)\n```")
    assert [(c.tool, c.args) for c in r.calls] == [("execute_ipython_cell", {"code": "print(2)"})]
    r = parse_reply(o, "The result is 9.\n<finish>9</finish>")
    assert r.calls == [] and r.answer == "9"
    # react-python has only a python tool: an unlabelled block runs as Python, a bash block does not
    p = load_harness("react-python")
    assert parse_reply(p, "```\nprint(3)\n```").calls[0].args == {"code": "print(3)"}
    assert parse_reply(p, "```bash\necho 3\n```").calls == []


def test_search_replace_blocks_several_files_and_creation():
    a = load_harness("aider-like")
    text = ("Changes:\n\nsolution.py\n```python\n<<<<<<< SEARCH\n    return 0\n=======\n    return a + b\n>>>>>>> REPLACE\n"
            "```\n\nnotes/new.txt\n```\n<<<<<<< SEARCH\n=======\nhello\n>>>>>>> REPLACE\n```\n")
    r = parse_reply(a, text)
    assert r.error is None
    assert [(c.impl, c.args) for c in r.calls] == [
        ("str_replace", {"path": "solution.py", "old": "    return 0", "new": "    return a + b"}),
        ("write_file", {"path": "notes/new.txt", "content": "hello\n"}),
    ]
    bad = parse_reply(a, "a.py\n<<<<<<< SEARCH\nx\n=======\ny\n")
    assert "not closed" in bad.error and bad.calls == []
    assert "must follow a line with the file path" in parse_reply(a, "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE").error


def test_whole_file_format(tmp_path):
    import yaml

    from tasks.harnesses.spec import SPEC_DIR

    data = yaml.safe_load(open(SPEC_DIR / "aider-like.yaml"))
    data.update(name="aider-whole", action_format="whole_file")
    p = tmp_path / "aider-whole.yaml"
    p.write_text(yaml.safe_dump(data))
    spec = load_harness(p)
    r = parse_reply(spec, "Here:\n\nsolution.py\n```python\ndef f():\n    return 1\n```\nDone.")
    assert [(c.impl, c.args) for c in r.calls] == [("write_file", {"path": "solution.py", "content": "def f():\n    return 1\n"})]


@pytest.mark.parametrize("text, want", [("so 1,234.", "1234"), ("none", None), ("3 then -7", "-7")])
def test_fallback_and_last_code_block(text, want):
    assert fallback_answer(load_harness("direct"), text) == want
    assert last_code_block("a\n```py\nx=1\n```\nb\n```\ny=2\n```") == "y=2"
    assert last_code_block("no code") is None
