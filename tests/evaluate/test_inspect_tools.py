"""The Inspect logs of attempts run by the real harness engine (a scripted policy, the bubblewrap
sandbox): each tool call is a ``ToolEvent`` with its function, arguments, the text the model was
shown, its exec status and exit code and its own time; each model call's time is the request's
share of its batch, marked with the batch's wall time and size; the texts are the model's, shown as
plain text. Read back with :func:`inspect_ai.log.read_eval_log`."""

from __future__ import annotations

import shutil

import pytest

from tasks.hashing import seed_from, sha256_json

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

SCRIPTS = {  # per harness, per turn (every episode of a batch gets the same reply)
    "react-python": ["Let me check.\n```python\nimport sys\nprint(6 * 7)\nsys.exit(3)\n```",
                     "```python\nprint(43)\n```", "Answer: 42"],
    "direct": ["Answer: 42"],
}


def _engine_runner(tok, batches):
    """A runner with :func:`tasks.rollout.runner.iter_records`'s signature that runs the records
    through :func:`tasks.rollout.harness.run_episodes` with the scripted policy, one batch per
    harness (``batches`` gets each batch's size)."""
    from tasks.config import SandboxConfig
    from tasks.rollout.harness import EpisodeJob, run_episodes
    from tests.rollout.test_harness_engine import ScriptedPolicy

    def run(policy, cfg, specs, tasks, records, samples, seed, tag, **_):
        by_harness: dict[str, list] = {}
        for r in records:
            by_harness.setdefault(r["harness_id"], []).append(r)
        for hid, recs in sorted(by_harness.items()):
            spec = specs[hid]
            jobs = [EpisodeJob(sha256_json([r["record_id"], tag, i]), r, tasks[r["task_id"]], i,
                               seed_from(seed, r["record_id"], i)) for r in recs for i in range(samples)]
            eps, turns = run_episodes(ScriptedPolicy(tok, SCRIPTS[spec.name]), spec, jobs, SandboxConfig(), seed=seed)
            batches[spec.name] = len(jobs)
            for e, j in zip(eps, jobs):
                e.update(record=j.record, sample_idx=j.sample_idx, seed=j.seed, policy_id="scripted")
            yield eps, turns

    return run


@pytest.fixture(scope="module")
def engine_logs(tmp_path_factory, tiny_model_dir):
    from transformers import AutoTokenizer

    from tasks.config import RunConfig
    from tasks.evaluate.stage import run_evaluate
    from tests.evaluate.test_stage import _store

    tmp = tmp_path_factory.mktemp("engine-logs")
    cfg = RunConfig.model_validate({"name": "engine", "seed": 3, "suites": [{"name": "basic_arithmetic", "size": 8,
                                                                             "seed": 2}],
                                    "split": {"test_fraction": 0.5}, "harnesses": ["direct"],
                                    "evaluate": {"attempts": 2, "harnesses": ["direct", "react-python"],
                                                 "bootstrap_resamples": 200}, "analyze": {"ceiling_k": 2}})
    store, refs, tasks, _ = _store(tmp, cfg)
    batches: dict[str, int] = {}
    out = run_evaluate(store, cfg, refs, episode_runner=_engine_runner(AutoTokenizer.from_pretrained(tiny_model_dir),
                                                                       batches))
    return store, out, batches, {t["task_id"]: t for t in tasks}


def test_a_tool_call_is_a_tool_event_with_its_result_status_and_time(engine_logs):
    from datetime import datetime

    from inspect_ai.event import ModelEvent, ToolEvent
    from inspect_ai.log import read_eval_log

    store, out, batches, _ = engine_logs
    log = read_eval_log(f"{store.root}/evaluate/inspect/base.react-python.eval")
    turns = {(t["episode_id"], t["turn_idx"]): t for t in store.rows(out["eval_turns"])}
    assert log.samples and batches["react-python"] == len(log.samples)
    for s in log.samples:
        kinds = [type(e).__name__ for e in s.events]
        assert kinds == ["ModelEvent", "ToolEvent", "ModelEvent", "ToolEvent", "ModelEvent"], kinds
        m0, t0, m1, t1, m2 = s.events
        assert isinstance(t0, ToolEvent) and isinstance(m0, ModelEvent)
        assert t0.function == "python" and t0.arguments == {"code": "import sys\nprint(6 * 7)\nsys.exit(3)"}
        # the result is the text the model was shown (the observation's own words), the error its
        # exec status and exit code
        assert t0.result == "Output:\n42\n(2 turns left)" == turns[(s.metadata["eval_id"], 0)]["observation"]
        assert t0.error is not None and t0.error.message == "error (exit code 3)\nOutput:\n42\n(2 turns left)"
        assert t0.metadata["exit_code"] == 3 and t0.metadata["status"] == "error"
        assert t1.error is None and t1.metadata["exit_code"] == 0 and t1.result == "Output:\n43\n(1 turns left)"
        # the tool ran after the engine call that asked for it and before the next one
        assert m0.completed <= t0.timestamp <= t0.completed <= m1.timestamp
        assert t0.working_time == pytest.approx((t0.completed - t0.timestamp).total_seconds(), abs=1e-3)
        assert t0.working_time > 0
        # a model call's time is the request's share of its batch, the batch's wall time and size beside it
        for m in (m0, m1, m2):
            wall = (m.completed - m.timestamp).total_seconds()
            assert m.metadata["batch_requests"] == batches["react-python"]
            assert m.metadata["batch_wall_s"] == pytest.approx(wall, abs=1e-3)
            assert m.working_time == m.output.time == pytest.approx(m.metadata["batch_wall_s"] / batches["react-python"])
        # the sample's time (Inspect View's Duration) is its own share too; its window is the clock's
        assert s.working_time == s.total_time == pytest.approx(sum(e.working_time for e in s.events))
        window = (datetime.fromisoformat(s.completed_at) - datetime.fromisoformat(s.started_at)).total_seconds()
        assert window == pytest.approx((m2.completed - m0.timestamp).total_seconds(), abs=1e-3)
        assert s.total_time < window  # a share of each batch, not the batch's wall time


def test_the_log_shows_the_texts_the_model_read_as_plain_text(engine_logs):
    from inspect_ai.log import read_eval_log

    from tasks.harnesses.spec import load_harness

    store, out, _, tasks = engine_logs
    log = read_eval_log(f"{store.root}/evaluate/inspect/base.react-python.eval")
    # Inspect View renders a log's texts as Markdown unless the log says they are not to be trusted
    assert log.eval.viewer is not None and log.eval.viewer.trust_content is False
    s = log.samples[0]
    system, instruction, reply, observation = s.messages[:4]
    assert system.text == load_harness("react-python").render_system() and "```python\nprint(...)\n```" in system.text
    assert instruction.text == tasks[s.id]["instruction"]
    assert reply.text == SCRIPTS["react-python"][0]
    assert observation.role == "user" and observation.text == "Output:\n42\n(2 turns left)"  # the role it had
    direct = read_eval_log(f"{store.root}/evaluate/inspect/base.direct.eval")
    assert direct.samples and all(type(e).__name__ == "ModelEvent" for smp in direct.samples for e in smp.events)


@pytest.mark.slow
def test_inspect_view_shows_the_tool_call_and_the_prompt_as_the_model_read_it(engine_logs, tmp_path):
    """Headless Chromium opens a react-python sample in ``inspect view``: the transcript shows the
    tool call (its code, its error with the exit code and the output the model read) and the
    system prompt's code fence as text; the screenshot is kept for a look."""
    import os
    import subprocess
    import sys
    import time
    import urllib.parse
    from pathlib import Path

    import httpx

    from tests.facilities import chromium_missing, free_port, require, stop_process_group
    from tests.flows._browser import driver_for, wait_js

    require("chromium", chromium_missing())
    store, out, _, _ = engine_logs
    sample = min(r["task_id"] for r in store.rows(out["evaluations"]) if r["harness_name"] == "react-python")
    port = free_port()
    log = open(tmp_path / "view.log", "w")
    view = subprocess.Popen([str(Path(sys.executable).parent / "inspect"), "view", "start", "--log-dir",
                             f"{store.root}/evaluate/inspect", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    driver = None
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/logs", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert view.poll() is None and time.monotonic() < deadline, (tmp_path / "view.log").read_text()[-2000:]
            time.sleep(0.5)
        driver = driver_for(tmp_path, 1500)
        sid = urllib.parse.quote(sample, safe="")
        driver.get(f"http://127.0.0.1:{port}/#/logs/base.react-python.eval/samples/sample/{sid}/1/transcript")
        text = wait_js(driver, "const t = document.body.innerText; return t.includes('exit code 3') ? t : ''")
        shots = Path(os.environ.get("HARNESSRL_SCREENSHOTS", "/tmp/harnessrl-screenshots"))
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / "inspect-view-tool-call.png"))
        assert text, driver.execute_script("return document.body.innerText")[:2000]
        assert "TOOL: PYTHON" in text.upper() and "print(6 * 7)" in text and "sys.exit(3)" in text
        assert "error (exit code 3)\nOutput:\n42" in text  # the error, then the output the model read
        assert "```python\nprint(...)\n```" in text  # the system prompt's fence, not a rendered code block
    finally:
        if driver is not None:
            driver.quit()
        stop_process_group(view)
        log.close()
