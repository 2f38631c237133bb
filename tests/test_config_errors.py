"""Every bad config gives one clear message naming the file, the key and the value, both from
``load_config`` and from ``harnessrl run -c bad.yaml`` (exit status 2, no traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.config import ConfigError, load_config

OK = "name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\n"

# (id, file text or None for "no such file", overrides, substrings the one message must contain)
CASES = [
    ("missing-file", None, {}, ["config file does not exist"]),
    ("not-yaml", "name: [x\n", {}, ["not valid YAML", "line 1"]),
    ("tab-indent", "name: x\n\tsuites: 1\n", {}, ["not valid YAML", "line 2"]),
    ("empty-file", "", {}, ["the file is empty"]),
    ("top-level-list", "- 1\n- 2\n", {}, ["top level must be a mapping", "list"]),
    ("unknown-top-key", OK + "trian: {steps: 2}\n", {}, ["'trian'", "Extra inputs are not permitted"]),
    ("unknown-nested-key", OK + "train: {stpes: 2}\n", {}, ["'train.stpes'", "Extra inputs"]),
    ("missing-required", "suites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\n", {},
     ["'name' is missing"]),
    ("wrong-type", OK + "train: {epochs: many}\n", {}, ["'train.epochs'", "'many'", "integer"]),
    ("out-of-range", OK + "sandbox: {memory_mb: 8}\n", {}, ["'sandbox.memory_mb'", "= 8", "greater than or equal"]),
    ("bad-enum", OK + "policy: {engine: tensorrt}\n", {}, ["'policy.engine'", "'tensorrt'", "'hf'"]),
    ("bad-name-pattern", OK.replace("name: x", "name: 'a b'"), {}, ["'name'", "'a b'", "pattern"]),
    ("no-suites", "name: x\nsuites: []\nharnesses: [direct]\n", {}, ["'suites'", "at least 1"]),
    ("missing-model-folder", OK + "policy: {model: /nonexistent/model}\n", {},
     ["policy.model='/nonexistent/model'", "neither a packaged model"]),
    ("unknown-harness", OK.replace("[direct]", "[direct, nosuch]"), {}, ["'harnesses'", "harness 'nosuch'",
                                                                        "shipped harnesses"]),
    ("duplicate-harness", OK.replace("[direct]", "[direct, direct]"), {}, ["'harnesses'", "duplicates"]),
    ("unknown-reasoning-gym-dataset", OK.replace("basic_arithmetic", "basic_arithmetik"), {},
     ["suites[].name='basic_arithmetik'", "not a reasoning-gym dataset", "'suites.0'"]),
    ("terminal-bench-folder-missing", "name: x\nsuites: [{source: terminal_bench, name: /no/such/tasks, size: 2}]\n"
     "harnesses: [direct]\n", {}, ["suites[].name='/no/such/tasks'", "no such folder"]),
    ("init-adapter-missing", OK + "train: {init_adapter: /no/such/adapter}\n", {},
     ["train.init_adapter='/no/such/adapter'", "adapter_config.json"]),
    ("docker-image-on-bwrap", OK + "sandbox: {backend: bwrap, docker_image: img:1}\n", {},
     ["sandbox.docker_image='img:1'", "only used by backend 'docker'"]),
    ("output-kill-below-kept", OK + "sandbox: {output_bytes: 4096, output_kill_bytes: 1024}\n", {},
     ["sandbox.output_kill_bytes=1024", "sandbox.output_bytes=4096"]),
    ("openai-without-section", OK + "policy: {engine: openai}\n", {}, ["policy.engine='openai'", "policy.openai"]),
    ("openai-bad-url", OK + "policy: {engine: openai, openai: {base_url: 'ftp://h', model: m}}\n", {},
     ["'policy.openai.base_url'", "'ftp://h'"]),
    ("online-on-openai", OK + "policy: {engine: openai, openai: {base_url: 'http://h:8000/v1', model: m}}\n"
     "train: {mode: online, steps: 2}\n", {},
     ["policy.engine='openai' with train.mode='online'", "one of ['hf', 'vllm']"]),
    ("gspo-token-mean", OK + "train: {algorithm: gspo, agg: token_mean}\n", {}, ["train.agg='token_mean'", "GSPO"]),
    ("online-recompute", OK + "train: {mode: online, steps: 2, old_logprobs: recompute, max_staleness: 1}\n", {},
     ["train.old_logprobs='recompute'", "max_staleness=1", "tis_cap"]),
    ("online-dask", OK + "train: {mode: online, steps: 2}\nrollout: {task_runner: dask}\n", {},
     ["rollout.task_runner='dask'", "train.mode='online'"]),
    ("staleness-frozen", OK + "train: {max_staleness: 2}\n", {}, ["train.max_staleness=2", "online' only"]),
    ("dr-grpo-no-max-len", OK + "train: {agg: seq_mean_token_sum_norm}\n", {}, ["seq_mean_token_sum_norm",
                                                                                "train.max_len"]),
    ("ceiling-above-attempts", OK + "evaluate: {attempts: 2}\nanalyze: {ceiling_k: 4}\n", {},
     ["analyze.ceiling_k=4", "evaluate.attempts=2"]),
    ("analyze-reference-unknown", OK + "analyze: {reference: within}\n", {}, ["analyze.reference='within'", "base"]),
    ("branching-checkpoint-unknown", OK + "analyze: {branching: {episodes_per_harness: 1, checkpoints: [cross]}}\n",
     {}, ["analyze.branching.checkpoints", "'cross'"]),
    ("branching-k-above-n", OK + "analyze: {branching: {n: 2, k: 4}}\n", {}, ["analyze.branching.k=4", "n=2"]),
    ("leakage-folds-one", OK + "analyze: {leakage: {folds: 1}}\n", {}, ["analyze.leakage.folds", "1"]),
    # a held-out evaluation harness may be absent from `harnesses`, but it must exist
    ("eval-harness-unknown", OK + "evaluate: {harnesses: [no-such-harness]}\n", {},
     ["evaluate.harnesses names 'no-such-harness'", "shipped harnesses"]),
    ("miniwob-params", "name: x\nsuites: [{source: miniwob, name: basic, size: 2, params: {a: 1}}]\n"
     "harnesses: [direct]\n", {}, ["suites[].params={'a': 1}", "takes no params"]),
    ("override-wrong-type", OK, {"train.epochs": "many"}, ["--set: key 'train.epochs'", "'many'"]),
    ("override-typo-names-set", OK, {"train.stepz": 3}, ["--set: key 'train.stepz' = 3", "Extra inputs"]),
    ("override-into-scalar", OK, {"name.first": 1}, ["override name.first=1", "key 'name' is 'x', not a mapping"]),
]


def _write(tmp_path, text):
    p = tmp_path / "bad.yaml"
    if text is not None:
        p.write_text(text)
    return p


def test_the_base_config_is_valid(tmp_path):
    assert load_config(_write(tmp_path, OK)).harnesses == ["direct"]


@pytest.mark.parametrize("text,overrides,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_load_config_names_file_key_and_value(tmp_path, text, overrides, needles):
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p, overrides)
    msg = str(e.value)
    source = "--set" if overrides else str(p)  # a bad --set value is blamed on --set, not on the file
    assert msg.startswith(f"{source}: "), msg
    for n in needles:
        assert n in msg, (n, msg)
    assert msg.count(f"{source}:") == 1, f"expected one message, got: {msg}"


@pytest.mark.parametrize("text,overrides,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cli_run_exits_2_with_that_message(tmp_path, text, overrides, needles):
    p = _write(tmp_path, text)
    args = ["run", "-c", str(p), "--run-dir", str(tmp_path / "run")]
    for k, v in overrides.items():
        args += ["--set", f"{k}={v}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    out = res.output
    assert "Traceback" not in out and res.exception is None or isinstance(res.exception, SystemExit)
    for n in needles:
        assert n in out, (n, out)
    assert not (tmp_path / "run").exists(), "a bad config must not create the run folder"


def test_from_lists_the_stages_in_help_and_in_its_error(tmp_path):
    from tasks.config import STAGES

    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    help_text = " ".join(out.replace("│", " ").split())
    assert f"force this stage and every later one ({', '.join(STAGES)})" in help_text
    res = CliRunner().invoke(app, ["run", "--from", "trian", "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and f"--from 'trian': not a stage; stages are {', '.join(STAGES)}" in res.output
