"""A stage's cached result counts only while the bytes it names are still there
(:mod:`flows.cache`): through Prefect's real cache (``flows.common.call_stage`` in a flow, results
persisted in the run folder), a changed byte, a deleted Parquet file and a deleted manifest each
make the stage run again (state ``Completed``, not ``Cached``); a sealed stage (evaluate) refuses
with one line naming the file and the ``--from`` to use, and leaves its record alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cache import StaleCacheError, artifact_problem, file_sha256
from schemas import ArtifactStore
from tasks.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows():
    from tasks.train.kl_check import kl_check_table

    return kl_check_table(vocab=2, length=1, samples=8, seed=0)


@pytest.fixture(scope="module")
def cfg():
    return load_config(REPO / "configs/default.yaml")


def make_stage(stage: str, rows: list[dict]):
    """A stage task named ``stage`` whose function writes one artifact and counts its calls."""
    from flows.common import stage_task

    calls: list[int] = []

    def fn(store, cfg, inputs):
        calls.append(1)
        return {"kl_check": store.write(stage, "kl_check", rows, config_hash="")}

    return stage_task(stage, fn), calls


def run_stage(task, run_dir: Path, cfg, force: bool = False):
    from prefect import flow

    from flows.common import call_stage

    @flow(name="cache-check-test")
    def one() -> tuple:
        return call_stage(task, str(run_dir), cfg, {}, force)

    return one()


def flip_byte(path: Path, at: int = 200) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x01
    path.write_bytes(bytes(b))


def test_a_changed_or_missing_artifact_reruns_the_stage(prefect_harness, tmp_path, rows, cfg):
    task, calls = make_stage("rollout", rows)
    rd = tmp_path / "run"
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Completed", 1)
    ref = out["kl_check"]
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Cached", 1)  # the files match: Prefect's cache hit stands

    parquet = rd / "rollout/kl_check.parquet"
    flip_byte(parquet)
    assert "differs from its manifest" in artifact_problem(ArtifactStore(rd), ref)
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Completed", 2)
    assert file_sha256(ArtifactStore(rd), "rollout/kl_check.parquet") == ref.sha256 == out["kl_check"].sha256
    assert run_stage(task, rd, cfg)[1] == "Cached"

    parquet.unlink()
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Completed", 3) and parquet.is_file()

    (rd / "rollout/kl_check.manifest.json").unlink()
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Completed", 4)
    assert ArtifactStore(rd).manifest("rollout", "kl_check")["sha256"] == ref.sha256
    assert run_stage(task, rd, cfg)[1] == "Cached"


def test_a_changed_manifest_reruns_the_stage(prefect_harness, tmp_path, rows, cfg):
    import json

    task, calls = make_stage("train", rows)
    rd = tmp_path / "run"
    run_stage(task, rd, cfg)
    m = rd / "train/kl_check.manifest.json"
    doc = json.loads(m.read_text())
    doc["rows"] += 1  # the row count alone differs from the cached result's
    m.write_text(json.dumps(doc))
    out, state = run_stage(task, rd, cfg)
    assert (state, len(calls)) == ("Completed", 2)
    assert json.loads(m.read_text())["rows"] == len(rows)


def test_a_sealed_stage_refuses_with_one_line(prefect_harness, tmp_path, rows, cfg):
    from flows.common import stage_state_path

    task, calls = make_stage("evaluate", rows)
    rd = tmp_path / "run"
    run_stage(task, rd, cfg)
    record = (rd / stage_state_path("evaluate")).read_text()
    for damage in ("flip", "delete"):
        parquet = rd / "evaluate/kl_check.parquet"
        original = parquet.read_bytes()
        flip_byte(parquet) if damage == "flip" else parquet.unlink()
        with pytest.raises(StaleCacheError) as e:
            run_stage(task, rd, cfg)
        msg = str(e.value)
        assert "\n" not in msg and f"{rd}/evaluate/kl_check.parquet" in msg and "harnessrl run --from evaluate" in msg
        assert ("differs from its manifest" if damage == "flip" else "the file is missing") in msg
        assert len(calls) == 1  # not rerun
        assert (rd / stage_state_path("evaluate")).read_text() == record  # harnessrl status reads it as corrupt
        parquet.write_bytes(original)
    assert run_stage(task, rd, cfg)[1] == "Cached"
    # --from evaluate (force) is the way to re-seal: it runs
    flip_byte(rd / "evaluate/kl_check.parquet")
    assert run_stage(task, rd, cfg, force=True)[1] == "Completed" and len(calls) == 2


def test_an_unreadable_result_record_reruns(prefect_harness, tmp_path, rows, cfg):
    task, calls = make_stage("analyze", rows)
    rd = tmp_path / "run"
    run_stage(task, rd, cfg)
    records = [p for p in (rd / ".prefect").iterdir() if p.is_file()]
    assert len(records) == 1
    records[0].write_bytes(b"{not json")
    assert run_stage(task, rd, cfg)[1] == "Completed" and len(calls) == 2
