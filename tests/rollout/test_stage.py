"""The rollout stage's own checks (the sampling itself is tested with the engines and runners)."""

import pytest

from schemas import ArtifactError, ArtifactStore
from tasks.config import RunConfig
from tasks.records.freeze import freeze_tables


def test_a_rollout_that_samples_no_episode_fails_in_one_line_and_writes_nothing(tiny_model_dir, tmp_path, monkeypatch):
    import tasks.rollout.stage as stage

    cfg = RunConfig.model_validate({"name": "r", "suites": [{"name": "basic_arithmetic", "size": 6}],
                                    "harnesses": ["direct"], "policy": {"model": str(tiny_model_dir)}})
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp_path / "run")
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    calls = []
    monkeypatch.setattr(stage, "run_records", lambda *a, **kw: (calls.append(len(a[4])), ([], []))[1])
    with pytest.raises(ArtifactError) as e:
        stage.run_rollout(store, cfg, refs)
    msg = str(e.value)
    assert calls == [sum(r["split"] == "train" for r in records)] and calls[0] > 0  # it asked for episodes
    assert msg.startswith("[rollout/episodes] episodes: 0 rows (no episode was sampled: ") and "\n" not in msg, msg
    assert not (tmp_path / "run/rollout/episodes.parquet").exists()
    assert not (tmp_path / "run/rollout/turns.parquet").exists()
    assert not list((tmp_path / "run/rollout").glob(".tmp-*"))
    assert [len(store.rows(refs[k])) for k in ("tasks", "records")] == [len(tasks), len(records)]
