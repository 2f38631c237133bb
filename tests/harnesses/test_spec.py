import pytest
import yaml

from tasks.harnesses.spec import HarnessError, load_harness


SHIPPED = ["agent-submit", "aider-like", "answer-tag", "answer-tag-1shot", "answer-tag-2shot", "boxed", "calculator",
           "calculator-demo", "direct", "json-answer", "openhands-like", "python-demo", "python-demo-skill",
           "qwen-code-like", "react-python", "react-python-skill", "react-python-skill-file", "swe-agent-like",
           "talkmesh", "think-answer", "web-react", "worked-answer"]


def test_every_shipped_family_loads_with_its_loop_and_format():
    from tasks.harnesses.spec import shipped_harnesses

    assert shipped_harnesses() == SHIPPED
    got = {n: (load_harness(n).action_format, load_harness(n).loop_type) for n in SHIPPED}
    assert got == {
        "agent-submit": ("function_call", "react"),
        "aider-like": ("search_replace", "reflect_on_test_failure"),
        "answer-tag": ("final_answer", "single_turn"),
        "answer-tag-1shot": ("final_answer", "single_turn"),
        "answer-tag-2shot": ("final_answer", "single_turn"),
        "boxed": ("final_answer", "single_turn"),
        "calculator": ("function_call", "react"),
        "calculator-demo": ("xml_tags", "react"),
        "direct": ("final_answer", "single_turn"),
        "json-answer": ("final_answer", "single_turn"),
        "openhands-like": ("fenced_code", "codeact"),
        "python-demo": ("fenced_code", "react"),
        "python-demo-skill": ("fenced_code", "react"),
        "qwen-code-like": ("function_call", "react"),
        "react-python": ("fenced_code", "react"),
        "react-python-skill": ("fenced_code", "react"),
        "react-python-skill-file": ("fenced_code", "react"),
        "swe-agent-like": ("function_call", "react"),
        "talkmesh": ("final_answer", "talkmesh"),
        "think-answer": ("final_answer", "single_turn"),
        "web-react": ("xml_tags", "react"),
        "worked-answer": ("final_answer", "single_turn"),
    }
    q = load_harness("qwen-code-like")
    assert [t.name for t in q.tools] == ["read_file", "write_file", "edit", "run_shell_command", "grep_search", "glob"]
    assert q.tool("edit").impl_name == "str_replace" and q.tool("edit").arg("old") == "old_string"
    assert {t.name for t in load_harness("swe-agent-like").tools} >= {"view", "search", "edit", "submit"}
    # JSON examples in a system prompt are text, not template variables; {tools} is filled in
    sysp = load_harness("swe-agent-like").render_system()
    assert '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>' in sysp
    assert "- view: Show a file" in sysp and "{tools}" not in sysp


def test_shipped_specs_load_and_hash_stably():
    d, r = load_harness("direct"), load_harness("react-python")
    assert d.loop_type == "single_turn" and r.loop_type == "react" and r.max_turns == 3
    assert d.harness_id == load_harness("direct").harness_id != r.harness_id
    assert len(d.harness_id) == 64


def _write(tmp_path, **changes):
    data = yaml.safe_load(open(load_harness.__globals__["SPEC_DIR"] / "react-python.yaml"))
    data.update(changes)
    p = tmp_path / "h.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_unknown_tool_is_refused_with_file_and_key(tmp_path):
    p = _write(tmp_path, tools=[{"name": "browser", "description": "x"}])
    with pytest.raises(HarnessError, match=r"unknown tool implementation 'browser'") as e:
        load_harness(p)
    assert str(p) in str(e.value)


def test_undefined_template_variable_is_refused(tmp_path):
    with pytest.raises(HarnessError, match=r"instance_template uses undefined variable\(s\) \['solution'\]"):
        load_harness(_write(tmp_path, instance_template="{instruction} {solution}"))


def test_unknown_key_and_missing_spec(tmp_path):
    with pytest.raises(HarnessError, match="max_turn"):
        load_harness(_write(tmp_path, max_turn=3))
    with pytest.raises(HarnessError, match="shipped harnesses"):
        load_harness("no-such-harness")


def test_a_changed_prompt_changes_the_harness_id(tmp_path):
    a = load_harness(_write(tmp_path, system_prompt="A"))
    b = load_harness(_write(tmp_path, system_prompt="B"))
    assert a.harness_id != b.harness_id


@pytest.mark.parametrize("change, message", [
    ({"tools": [{"name": "python", "description": "x", "parameters": {"type": "object", "properties": {}}}]},
     r"tools\[python\].parameters lacks \['code'\], required by implementation python"),
    ({"tools": [{"name": "run", "impl": "shell", "description": "x", "arguments": {"cmd": "c"},
                 "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]},
     r"tools\[run\].arguments maps \['cmd'\], which shell does not take"),
    ({"tools": [{"name": "python", "description": "x", "parameters": {"type": "object", "properties": 3}}]},
     r"tools\[python\].parameters is not a JSON schema"),
    ({"action_format": "whole_file"}, r"action_format whole_file needs a tool with impl write_file"),
    ({"action_format": "search_replace"}, r"action_format search_replace needs a tool with impl str_replace"),
    ({"loop_type": "reflect_on_test_failure"}, r"needs a reflect: \{command: ...\} section"),
    ({"stop": {"answer_pattern": "Answer: .+"}}, r"needs one capture group"),
    ({"environments": ["browser"]}, r"browser harness cannot have sandbox tools"),
    ({"environments": ["moon"]}, r"environments"),
    ({"system_prompt": "Use {tool_list}"}, r"system_prompt uses undefined variable\(s\) \['tool_list'\]"),
])
def test_inconsistent_specs_are_refused_naming_the_key(tmp_path, change, message):
    with pytest.raises(HarnessError, match=message):
        load_harness(_write(tmp_path, **change))
