import pytest
import yaml

from tasks.harnesses.spec import HarnessError, load_harness


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
    with pytest.raises(HarnessError, match=r"unknown tool 'browser'") as e:
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
