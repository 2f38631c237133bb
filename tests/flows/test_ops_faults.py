"""Crash safety and ``harnessrl status`` on a tiny-model run: the pipeline is SIGKILLed at three
points (between freeze and rollout, inside rollout between temp write and rename, inside train
after a Parquet rename but before its manifest); each rerun resumes, finished stages show as
Cached, no temp file or half-written artifact is ever visible, and ``harnessrl verify`` passes;
then a changed sealed artifact is refused in one line and a deleted one reruns its stage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from schemas import ArtifactStore
from tests.facilities import bwrap_missing, require

REPO = Path(__file__).resolve().parents[2]
STAGES = ["freeze", "rollout", "train", "evaluate", "analyze"]
pytestmark = pytest.mark.slow


def tiny_config(model_dir: Path, name: str = "ops") -> dict:
    """The smallest whole pipeline: 4 arithmetic tasks (3 train, 1 test), one harness."""
    return {
        "name": name, "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 4, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.25},
        "harnesses": ["direct"],
        "policy": {"model": str(model_dir), "batch_size": 64},
        "rollout": {"samples_per_task": 2, "task_runner": "serial"},
        "train": {"micro_batch_size": 8, "lr": 0.01},
        "evaluate": {"attempts": 2},
        "analyze": {"ceiling_k": 2, "bootstrap_resamples": 200},  # test speed: the intervals' width is not checked
    }


def cli_run(cfg_path: Path, rd: Path, home: Path, fault: str | None) -> tuple[int, str]:
    """``harnessrl run`` in its own process group, against the session's Prefect API (conftest's
    ``prefect_harness`` exports ``PREFECT_API_URL``; a CLI without one starts its own temporary
    server, ~10 s per run). The group is killed afterwards. Returns (exit status, output)."""
    env = {**os.environ, "PREFECT_HOME": str(home), "COLUMNS": "200", "HARNESSRL_PROGRESS": "0"}
    env.pop("HARNESSRL_FAULT", None)
    if fault:
        env["HARNESSRL_FAULT"] = fault
    log = rd.parent / f"cli-{fault or 'run'}.log".replace("/", "_").replace(":", "_")
    with open(log, "w") as f:  # a file, not a pipe: the killed CLI's server child would hold a pipe open
        p = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "-c", str(cfg_path), "--run-dir", str(rd)],
                             cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p.wait(timeout=240)
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return p.returncode, log.read_text()


def states(output: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line.split("│")[2].strip() for line in output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip() in STAGES}


def temp_files(rd: Path) -> list[str]:
    return sorted(str(p.relative_to(rd)) for p in rd.rglob(".tmp-*"))


def status_of(rd: Path) -> dict[str, str]:
    from flows.status import run_status

    return {s.stage: s.state for s in run_status(ArtifactStore(rd))}


def test_kill_at_three_points_then_resume(tiny_model_dir, prefect_harness, tmp_path):
    require("bubblewrap", bwrap_missing())
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config(tiny_model_dir)))
    rd, home = tmp_path / "run", tmp_path / "prefect-home"

    # 1. between stages: freeze finished, rollout not started
    rc, out = cli_run(cfg_path, rd, home, "after:freeze")
    assert rc == -signal.SIGKILL, out
    assert status_of(rd) == {"freeze": "done", "rollout": "missing", "train": "missing", "evaluate": "missing",
                             "analyze": "missing"}

    # 2. inside rollout: episodes' bytes are in a temp file, not renamed
    rc, out = cli_run(cfg_path, rd, home, "tmp-written:rollout/episodes.parquet")
    assert rc == -signal.SIGKILL, out
    assert "Task run 'freeze-" in out and "Finished in state Cached" in out
    assert temp_files(rd) and all(t.startswith("rollout/.tmp-") for t in temp_files(rd))
    assert not (rd / "rollout/episodes.parquet").exists()
    assert status_of(rd) == {"freeze": "done", "rollout": "interrupted", "train": "missing", "evaluate": "missing",
                             "analyze": "missing"}
    st = CliRunner().invoke(app, ["status", str(rd)], env={"COLUMNS": "200"})
    assert st.exit_code == 0 and "interrupted" in st.output and "temp file(s) of an interrupted write" in st.output

    # 3. inside train: checkpoints.parquet renamed into place, its manifest not yet written
    rc, out = cli_run(cfg_path, rd, home, "renamed:train/checkpoints.parquet")
    assert rc == -signal.SIGKILL, out
    assert temp_files(rd) == []  # the restarted rollout removed the stray temp file
    assert (rd / "train/checkpoints.parquet").exists() and not (rd / "train/checkpoints.manifest.json").exists()
    assert status_of(rd) == {"freeze": "done", "rollout": "done", "train": "interrupted", "evaluate": "missing",
                             "analyze": "missing"}

    # 4. the rerun completes; what finished before is Cached
    rc, out = cli_run(cfg_path, rd, home, None)
    assert rc == 0, out
    assert states(out) == {"freeze": "Cached", "rollout": "Cached", "train": "Completed", "evaluate": "Completed",
                           "analyze": "Completed"}
    assert temp_files(rd) == []
    assert status_of(rd) == dict.fromkeys(STAGES, "done")
    v = CliRunner().invoke(app, ["verify", str(rd)])
    assert v.exit_code == 0, v.output
    store = ArtifactStore(rd)
    episodes = store.rows(("rollout", "episodes"))
    assert len(episodes) == 3 * 1 * 2  # train tasks x harnesses x samples
    assert len(store.rows(("evaluate", "evaluations"))) == 1 * 1 * 2 * 2  # test x harness x checkpoints x attempts

    # status: the table, the pass rates (from analyze/mismatch), and a corrupted file
    st = CliRunner().invoke(app, ["status", str(rd)], env={"COLUMNS": "200"})
    assert st.exit_code == 0, st.output
    mism = store.rows(("analyze", "mismatch"))
    for r in mism:
        assert f"{r['pass_at_1']:.3f}" in st.output
    assert store.manifest("rollout", "episodes")["sha256"][:12] in st.output
    assert "pass rates (analyze/mismatch)" in st.output
    path = rd / "train/train_steps.parquet"
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-10] + b"0123456789")
        bad = CliRunner().invoke(app, ["status", str(rd)], env={"COLUMNS": "200"})
        assert bad.exit_code == 1 and "corrupt" in bad.output and "differs from manifest" in bad.output
    finally:
        path.write_bytes(original)

    # a rerun checks the cached results' bytes (flows/cache.py): a changed sealed artifact is refused in
    # one line (no traceback, exit 1) ...
    sealed = rd / "evaluate/evaluations.parquet"
    original = sealed.read_bytes()
    sealed.write_bytes(original[:-10] + b"0123456789")
    rc, out = cli_run(cfg_path, rd, home, None)
    assert rc == 1 and "Traceback" not in out, out
    line = [x for x in out.splitlines() if "rows are sealed" in x and not x[:2].isdigit()]  # the CLI's, not a log line
    assert len(line) == 1 and f"{rd}/evaluate/evaluations.parquet" in line[0], out
    assert "differs from its manifest" in line[0] and "harnessrl run --from evaluate" in line[0]
    assert status_of(rd)["evaluate"] == "corrupt"
    sealed.write_bytes(original)
    # ... and a missing one reruns its stage, whose identical bytes keep the later stages Cached
    (rd / "rollout/turns.parquet").unlink()
    rc, out = cli_run(cfg_path, rd, home, None)
    assert rc == 0, out
    assert states(out) == {"freeze": "Cached", "rollout": "Completed", "train": "Cached", "evaluate": "Cached",
                           "analyze": "Cached"}
    assert "rollout/turns.parquet, but the file is missing: running the stage again" in out
    assert status_of(rd) == dict.fromkeys(STAGES, "done")


def test_status_refuses_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "notes").mkdir()
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code == 2 and "not a harnessrl run" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["status", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such run folder" in r.output
