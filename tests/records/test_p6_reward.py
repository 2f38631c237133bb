"""P6's reward rule (suites[].reward: p6): per-test fail-to-pass / pass-to-pass lists of the
terminal tasks (builtin sidecars, computed lists of other folders), the reward = fraction of
fail-to-pass tests passed forced to 0 when a pass-to-pass test breaks, HumanEval's single check,
and the config switch."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
from pydantic import ValidationError

from tasks.config import SuiteConfig
from tasks.records.suites.base import load_suite
from tasks.records.suites.terminal_bench import (
    BUILTIN_DIR, LISTS_FILE, TaskFormatError, compute_test_lists, run_oracle, task_from_folder,
)
from tasks.records.verifiers import VerifierError, entry_passed, grade, p6_reward
from tests.records.tb_helpers import Ctx, new_sandbox, require_sandbox


def _builtin(reward: str):
    return {t.task_id.split("/")[1]: t
            for t in load_suite(SuiteConfig(source="terminal_bench", name="builtin", size=1000, reward=reward))}


# ---------------------------------------------------------------------------------- pure rule


def test_p6_reward_rule():
    f2p, p2p = ["t.py::a", "t.py::b", "t.py::c[x]"], ["t.py::keep"]
    ok = {"t.py::a": True, "t.py::b": False, "t.py::c[x]": True, "t.py::keep": True}
    assert p6_reward(f2p, p2p, ok) == pytest.approx(2 / 3)
    assert p6_reward(f2p, p2p, {**ok, "t.py::keep": False}) == 0.0
    assert p6_reward(f2p, p2p, {k: v for k, v in ok.items() if k != "t.py::keep"}) == 0.0  # absent = not passed
    assert p6_reward([], p2p, ok) == 1.0  # nothing to fix: 1.0 iff the existing behaviour holds
    assert p6_reward([], p2p, {"t.py::keep": False}) == 0.0
    with pytest.raises(VerifierError, match="neither fail-to-pass nor pass-to-pass"):
        p6_reward([], [], ok)


def test_function_entry_covers_its_parametrized_instances():
    tests = {"t.py::f[1]": True, "t.py::f[2]": True, "t.py::fg": False}
    assert entry_passed("t.py::f", tests)  # "t.py::fg" is another function, not an instance of f
    assert not entry_passed("t.py::f", {**tests, "t.py::f[3]": False})
    assert not entry_passed("t.py::h", tests)


# ---------------------------------------------------------------------------------- builtin lists


def test_default_reward_leaves_specs_unchanged_and_p6_adds_the_lists():
    frac, p6 = _builtin("fraction"), _builtin("p6")
    assert frac.keys() == p6.keys()
    for name, t in frac.items():
        assert not {"reward", "fail_to_pass", "pass_to_pass"} & set(t.verifier_spec)
        spec = p6[name].verifier_spec
        assert spec["reward"] == "p6" and spec["lists_oracle_checked"] is True
        assert spec["fail_to_pass"] and not set(spec["fail_to_pass"]) & set(spec["pass_to_pass"])
        assert p6[name].task_hash != t.task_hash  # the rule is part of what is frozen and hashed
        assert p6[name].workspace == t.workspace and LISTS_FILE not in json.dumps(t.workspace)
    with_p2p = sorted(n for n, t in p6.items() if t.verifier_spec["pass_to_pass"])
    assert len(with_p2p) >= 2 and {"edit-config-ini", "rename-photos"} <= set(with_p2p)
    assert p6["edit-config-ini"].verifier_spec["pass_to_pass"] == [
        "test_outputs.py::test_database_untouched", "test_outputs.py::test_other_lines_unchanged"]
    assert p6["edit-config-ini"].verifier_spec["fail_to_pass"] == [
        "test_outputs.py::test_logging_level", "test_outputs.py::test_max_connections_enabled",
        "test_outputs.py::test_server_port_and_debug"]


@pytest.mark.parametrize("name", ["edit-config-ini", "rename-photos"])
def test_builtin_lists_match_a_fresh_run(name):
    require_sandbox()
    t = task_from_folder(BUILTIN_DIR / name, "builtin")
    saved = json.loads((BUILTIN_DIR / name / LISTS_FILE).read_text())
    got = compute_test_lists(t.verifier_spec, t.workspace["files"])
    assert got == {k: saved[k] for k in ("fail_to_pass", "pass_to_pass", "lists_oracle_checked")}


def _sh(sb, script: str) -> None:
    r = sb.exec(["bash", "-c", script])
    assert r.status == "ok", r


def test_p6_reward_is_zero_when_an_agent_breaks_a_pass_to_pass_test():
    require_sandbox()
    t, tf = _builtin("p6")["edit-config-ini"], _builtin("fraction")["edit-config-ini"]
    cases = {
        # sets every target value, but its unscoped sed also rewrites [database]'s debug line
        "fix_target_break_other": ("sed -i -e 's/^port = 8000/port = 8080/' -e 's/^debug = .*/debug = false/' "
                                   "-e 's/^#max_connections = .*/max_connections = 250/' "
                                   "-e 's/^level = info/level = warning/' config.ini", 0.0, 4 / 5),
        "partial_fix": ("sed -i 's/^level = info/level = warning/' config.ini", 1 / 3, 3 / 5),
        "untouched": ("true", 0.0, 2 / 5),
        "oracle": (None, 1.0, 1.0),
    }
    for name, (script, want_p6, want_frac) in cases.items():
        sb = new_sandbox(t.workspace)
        try:
            if script is None:
                run_oracle(t.verifier_spec, sb)
            else:
                _sh(sb, script)
            got = (grade(t.verifier_kind, t.verifier_spec, None, Ctx(sb)),
                   grade(tf.verifier_kind, tf.verifier_spec, None, Ctx(sb)))
        finally:
            sb.cleanup()
        assert got == (pytest.approx(want_p6), pytest.approx(want_frac)), name


# ---------------------------------------------------------------------------------- other folders


TB1 = {
    "task.yaml": "instruction: Write ok to /app/out.txt; keep /app/keep.txt.\nparser_name: pytest\n",
    "workspace/keep.txt": "keep\n",
    "tests/test_outputs.py": """
        import pytest
        def test_out():
            assert open('/app/out.txt').read() == 'ok\\n'
        @pytest.mark.parametrize("n", [1, 2])
        def test_out_twice(n):
            assert open('/app/out.txt').read() * n == 'ok\\n' * n
        def test_keep():
            assert open('/app/keep.txt').read() == 'keep\\n'
        def test_never():
            assert False
        """,
    "solution.sh": "echo ok > /app/out.txt\n",
}


def _folder(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_lists_computed_at_load_for_a_folder_without_sidecar(tmp_path):
    require_sandbox()
    t = task_from_folder(_folder(tmp_path / "t1", TB1), "x", reward="p6")
    s = t.verifier_spec
    # test_never fails after the oracle too: in neither list
    assert s["fail_to_pass"] == ["test_outputs.py::test_out", "test_outputs.py::test_out_twice[1]",
                                 "test_outputs.py::test_out_twice[2]"]
    assert s["pass_to_pass"] == ["test_outputs.py::test_keep"] and s["lists_oracle_checked"] is True


def test_lists_without_oracle_use_static_ids_of_files_that_fail_to_import(tmp_path):
    require_sandbox()
    files = {k: v for k, v in TB1.items() if k != "solution.sh"}
    files["tests/test_data.py"] = "DATA = open('/app/data.txt').read()\ndef test_data():\n    assert DATA\n" \
                                  "class TestMore:\n    def test_more(self):\n        assert DATA\n"
    t = task_from_folder(_folder(tmp_path / "t2", files), "x")
    got = compute_test_lists(t.verifier_spec, t.workspace["files"])
    assert got == {"fail_to_pass": ["test_data.py::TestMore::test_more", "test_data.py::test_data",
                                    "test_outputs.py::test_never", "test_outputs.py::test_out",
                                    "test_outputs.py::test_out_twice[1]", "test_outputs.py::test_out_twice[2]"],
                   "pass_to_pass": ["test_outputs.py::test_keep"], "lists_oracle_checked": False}


def test_stale_or_malformed_sidecar_is_refused(tmp_path):
    d = tmp_path / "edit-config-ini"
    shutil.copytree(BUILTIN_DIR / "edit-config-ini", d)
    task_from_folder(d, "x", reward="p6")  # an exact copy loads
    (d / "tests" / "test_outputs.py").write_text((d / "tests" / "test_outputs.py").read_text() + "\n# edited\n")
    with pytest.raises(TaskFormatError, match=f"{LISTS_FILE}:key: stale"):
        task_from_folder(d, "x", reward="p6")
    task_from_folder(d, "x")  # the default rule never reads the sidecar
    saved = json.loads((d / LISTS_FILE).read_text())
    (d / LISTS_FILE).write_text(json.dumps({**saved, "pass_to_pass": "test_a"}))
    with pytest.raises(TaskFormatError, match=f"{LISTS_FILE}:pass_to_pass"):
        task_from_folder(d, "x", reward="p6")


# ---------------------------------------------------------------------------------- HumanEval, config


def test_humaneval_p6_has_one_check_and_no_pass_to_pass():
    require_sandbox()
    (t,) = load_suite(SuiteConfig(source="humaneval", name="HumanEval", size=1, reward="p6"))
    (tf,) = load_suite(SuiteConfig(source="humaneval", name="HumanEval", size=1))
    assert t.verifier_spec["fail_to_pass"] == ["check"] and t.verifier_spec["pass_to_pass"] == []
    assert "reward" not in tf.verifier_spec and t.task_hash != tf.task_hash
    for code, want in ((t.workspace["files"]["solution.py"], 0.0),
                       (t.workspace["files"]["solution.py"] + t.verifier_spec["canonical_solution"], 1.0)):
        sb = new_sandbox({"files": {"solution.py": code}})
        try:
            assert grade(t.verifier_kind, t.verifier_spec, None, Ctx(sb)) == want
        finally:
            sb.cleanup()


def test_reward_switch_is_validated_naming_the_field():
    with pytest.raises(ValidationError, match="reward"):
        SuiteConfig(source="terminal_bench", name="builtin", size=1, reward="pass_rate")
    with pytest.raises(ValidationError, match=r"suites\[\]\.reward='p6'.*'reasoning_gym'"):
        SuiteConfig(source="reasoning_gym", name="basic_arithmetic", size=1, reward="p6")
    with pytest.raises(ValueError, match=r"suites\[\]\.reward='bogus'"):
        task_from_folder(BUILTIN_DIR / "edit-config-ini", "builtin", reward="bogus")


def test_many_tests_grade_within_the_default_output_limit(tmp_path):
    """Per-test results of a 300-test task do not fit 4096 bytes of output as ids; the grading run
    reports one byte per listed test, so p6 grading works with the default sandbox output limit."""
    require_sandbox()
    files = {**TB1, "tests/test_outputs.py": """
        import pytest
        @pytest.mark.parametrize("n", range(300))
        def test_a_rather_long_test_function_name(n):
            assert open('/app/out.txt').read() == 'ok\\n'
        def test_keep():
            assert open('/app/keep.txt').read() == 'keep\\n'
        """}
    t = task_from_folder(_folder(tmp_path / "t3", files), "x", reward="p6")
    assert len(t.verifier_spec["fail_to_pass"]) == 300 and t.verifier_spec["pass_to_pass"] == ["test_outputs.py::test_keep"]
    sb = new_sandbox(t.workspace)  # output_bytes: the default 4096
    try:
        assert grade(t.verifier_kind, t.verifier_spec, None, Ctx(sb)) == 0.0
        run_oracle(t.verifier_spec, sb)
        assert grade(t.verifier_kind, t.verifier_spec, None, Ctx(sb)) == 1.0
        _sh(sb, "echo changed > keep.txt")
        assert grade(t.verifier_kind, t.verifier_spec, None, Ctx(sb)) == 0.0
    finally:
        sb.cleanup()
