import json

import pyarrow.parquet as pq
import pytest

from schemas import ArtifactError, ArtifactStore


def _records(n=3, split="train"):
    return [{"record_id": f"r{i}", "task_id": f"t{i}", "task_hash": f"h{i}", "harness_id": "H",
             "harness_name": "direct", "split": split, "seed": 0} for i in range(n)]


def test_write_read_roundtrip_with_manifest(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = store.write("freeze", "records", _records(), config_hash="c0ffee")
    assert ref.rows == 3 and len(ref.sha256) == 64
    assert store.rows(ref)[1]["task_id"] == "t1"
    m = json.loads((tmp_path / "freeze" / "records.manifest.json").read_text())
    assert m["sha256"] == ref.sha256 and m["rows"] == 3 and m["config_hash"] == "c0ffee"
    assert m["schema_version"] == 1 and "pyarrow" in m["packages"] and "git_sha" in m["code_version"]
    assert not list((tmp_path / "freeze").glob(".tmp-*"))


def test_same_rows_give_byte_identical_parquet(tmp_path):
    a = ArtifactStore(tmp_path / "a").write("freeze", "records", _records())
    b = ArtifactStore(tmp_path / "b").write("freeze", "records", _records())
    assert a.sha256 == b.sha256
    assert (tmp_path / "a/freeze/records.parquet").read_bytes() == (tmp_path / "b/freeze/records.parquet").read_bytes()


def test_expectation_violation_names_artifact_column_and_rows_and_keeps_old_file(tmp_path):
    store = ArtifactStore(tmp_path)
    good = store.write("freeze", "records", _records())
    before = (tmp_path / "freeze/records.parquet").read_bytes()
    bad = _records(4)
    bad[2]["split"] = "validation"
    bad[3]["record_id"] = "r0"
    with pytest.raises(ArtifactError) as e:
        store.write("freeze", "records", bad)
    msg = str(e.value)
    assert "records" in msg and "'split'" in msg and "[2]" in msg and "'validation'" in msg
    assert "'record_id'" in msg and "[0, 3]" in msg
    assert (tmp_path / "freeze/records.parquet").read_bytes() == before
    assert store.rows(good)[0]["record_id"] == "r0"


def test_schema_violations_are_named(tmp_path):
    store = ArtifactStore(tmp_path)
    rows = _records()
    rows[1]["seed"] = "zero"
    with pytest.raises(ArtifactError, match="column 'seed'.*row 1"):
        store.write("freeze", "records", rows)
    rows = _records()
    rows[0]["colour"] = "red"
    with pytest.raises(ArtifactError, match="unexpected columns \\['colour'\\]"):
        store.write("freeze", "records", rows)


def test_read_catches_a_changed_file(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = store.write("freeze", "records", _records())
    path = tmp_path / "freeze/records.parquet"
    t = pq.read_table(path)
    pq.write_table(t.slice(0, 2), path)
    with pytest.raises(ArtifactError, match="SHA-256"):
        store.read(ref)


def test_missing_artifact_is_a_clear_error(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        ArtifactStore(tmp_path).read_bytes("freeze/records.parquet")


def test_file_url_store(tmp_path):
    store = ArtifactStore(f"file://{tmp_path}/remote-run")
    ref = store.write("freeze", "records", _records(2))
    assert (tmp_path / "remote-run/freeze/records.parquet").is_file()
    assert [r["record_id"] for r in store.rows(ref)] == ["r0", "r1"]


def test_stage_cache_keys_ignore_contracts_registered_by_other_modules():
    """A process that imports tasks.bipa (which registers its own contracts) must compute the
    same pipeline cache keys as one that does not."""
    from flows.common import stage_cache_key
    from schemas.contracts import CONTRACTS, Contract, register_contract
    from tasks.config import RunConfig

    cfg = RunConfig(name="k", suites=[{"name": "basic_arithmetic", "size": 3}], harnesses=["direct"])
    before = stage_cache_key("freeze", {"cfg": cfg, "inputs": {}})
    register_contract(Contract("zz_test_extra", 1, CONTRACTS["tasks"].schema))
    try:
        assert stage_cache_key("freeze", {"cfg": cfg, "inputs": {}}) == before
    finally:
        CONTRACTS.pop("zz_test_extra")


def _turn_rows(n):
    return [{"episode_id": f"e{i // 3}", "turn_idx": i % 3, "prompt_continues": i % 3 > 0,
             "prompt_added_ids": list(range(i % 7)), "completion_token_ids": [1, 2], "completion_logprobs": [-0.1, -0.2],
             "loss_mask": [1, 1], "completion_text": "x", "finish_reason": "stop", "action": "{}", "observation": "",
             "read_spans": ""} for i in range(n)]


@pytest.mark.parametrize("group_rows", [100, 1 << 16])
def test_stream_is_byte_identical_to_one_write_whatever_the_batches(tmp_path, monkeypatch, group_rows):
    import schemas.store as st

    monkeypatch.setattr(st, "ROW_GROUP_ROWS", group_rows)  # 100: the stream writes 4 row groups as it goes
    rows = _turn_rows(350)
    store = ArtifactStore(tmp_path)
    ref = store.write("a", "turns", rows, config_hash="c")
    with store.stream("b", "turns") as s:
        cuts = [0, 37, 37, 200, 350]  # uneven batches, one of them empty
        for lo, hi in zip(cuts, cuts[1:]):
            s.add(rows[lo:hi])
        tmp = list((tmp_path / "b").glob(".tmp-*"))
        # before the commit: three full row groups already in the temp file (100), or none (1 << 16)
        assert [p.stat().st_size > 0 for p in tmp] == ([True] if group_rows == 100 else [])
        out = s.commit(config_hash="c", extra={"k": 1})
    assert s.rows == 350 and out.rows == 350 and out.sha256 == ref.sha256
    assert (tmp_path / "a/turns.parquet").read_bytes() == (tmp_path / "b/turns.parquet").read_bytes()
    assert pq.ParquetFile(tmp_path / "b/turns.parquet").metadata.num_row_groups == -(-350 // group_rows)
    assert store.rows(out) == store.rows(ref)
    m = store.manifest("b", "turns")
    assert (m["rows"], m["bytes"], m["extra"]) == (350, (tmp_path / "b/turns.parquet").stat().st_size, {"k": 1})
    assert not store.stray_temp_files("b")


def test_rows_where_filters_across_row_groups_and_projects_columns(tmp_path, monkeypatch):
    import schemas.store as st

    monkeypatch.setattr(st, "ROW_GROUP_ROWS", 100)  # 4 row groups: the filter runs on each
    rows = _turn_rows(350)
    store = ArtifactStore(tmp_path)
    ref = store.write("a", "turns", rows, config_hash="c")
    ids = {rows[5]["episode_id"], rows[250]["episode_id"]}
    full = store.rows_where(ref, "episode_id", ids)
    assert full == [r for r in store.rows(ref) if r["episode_id"] in ids] and len(full) == 6
    slim = store.rows_where(ref, "episode_id", ids, columns=["turn_idx", "completion_text"])
    assert slim == [{"turn_idx": r["turn_idx"], "completion_text": r["completion_text"]} for r in full]
    with pytest.raises(ArtifactError, match="no column 'nope'"):
        store.rows_where(ref, "episode_id", ids, columns=["nope"])


def test_stream_refuses_a_key_repeated_across_batches_and_leaves_nothing(tmp_path, monkeypatch):
    import schemas.store as st

    monkeypatch.setattr(st, "ROW_GROUP_ROWS", 4)
    store = ArtifactStore(tmp_path)
    old = store.write("b", "turns", _turn_rows(3))
    rows = _turn_rows(12)
    with pytest.raises(ArtifactError, match=r"row 10 repeats \['episode_id', 'turn_idx'\] = \('e3', 0\)"):
        with store.stream("b", "turns") as s:
            s.add(rows[:10])  # two row groups already in the temp file
            s.add(rows[9:12])
    assert store.rows(store.ref("b", "turns")) == store.rows(old)  # the earlier artifact is intact
    assert not store.stray_temp_files("b")


def test_stream_checks_expectations_per_row_group_and_aborts(tmp_path, monkeypatch):
    import schemas.store as st

    monkeypatch.setattr(st, "ROW_GROUP_ROWS", 5)
    store = ArtifactStore(tmp_path)
    rows = _turn_rows(12)
    rows[7]["finish_reason"] = "abort"
    s = store.stream("b", "turns")
    s.add(rows[:6])
    with pytest.raises(ArtifactError, match=r"finish_reason.*rows \[2\].*counted from artifact row 5"):
        s.add(rows[6:])
    assert not store.stray_temp_files("b") and not store.exists("b/turns.parquet")
    with pytest.raises(ArtifactError, match="already committed or aborted"):
        s.add(rows[:1])
    bad = _turn_rows(2)
    bad[1]["prompt_added_ids"] = ["x"]
    with pytest.raises(ArtifactError, match="prompt_added_ids"), store.stream("b", "turns") as s2:
        s2.add(bad)
    assert not store.stray_temp_files("b")


# ---- empty artifacts ---------------------------------------------------------------------------

# the artifacts that may not be empty, with the stage that writes them and a phrase of the cause
NON_EMPTY = {"tasks": ("freeze", "no task came out of the configured suites"),
             "records": ("freeze", "no harness drives the tasks' environments"),
             "episodes": ("rollout", "the frozen records have no train split"),
             "train_steps": ("train", "no optimizer step ran"),
             "evaluations": ("evaluate", "no attempt ran"),
             "eval_cells": ("evaluate", "no (checkpoint, harness) cell")}


def _one_row(contract):
    """One row that meets ``contract``: every column set, in its set or at its minimum."""
    import pyarrow as pa

    pick = {e[1]: e[2][0] for e in contract.expectations if e[0] == "in_set"}
    pick.update({e[1]: e[2] for e in contract.expectations if e[0] == "between"})
    row = {}
    for f in contract.schema:
        t = f.type
        if f.name in pick:
            row[f.name] = pick[f.name]
        elif pa.types.is_list(t):
            row[f.name] = []
        elif pa.types.is_boolean(t):
            row[f.name] = False
        elif pa.types.is_integer(t):
            row[f.name] = 1
        elif pa.types.is_floating(t):
            row[f.name] = 0.5
        else:
            row[f.name] = "x"
    return row


def test_each_pipeline_contract_says_whether_it_may_be_empty():
    from schemas.contracts import CONTRACTS, PIPELINE_CONTRACTS, Contract

    assert {n for n in PIPELINE_CONTRACTS if not CONTRACTS[n].may_be_empty} == set(NON_EMPTY)
    with pytest.raises(ValueError, match="'zz': may_be_empty=False needs an empty_cause"):
        Contract("zz", 1, CONTRACTS["tasks"].schema, may_be_empty=False)


@pytest.mark.parametrize("name", sorted(NON_EMPTY))
def test_an_empty_artifact_that_may_not_be_empty_fails_in_one_line_and_keeps_the_earlier_one(tmp_path, name):
    from schemas.contracts import CONTRACTS

    stage, phrase = NON_EMPTY[name]
    c = CONTRACTS[name]
    store = ArtifactStore(tmp_path)
    earlier = store.write(stage, name, [_one_row(c)])
    path, man = tmp_path / stage / f"{name}.parquet", tmp_path / stage / f"{name}.manifest.json"
    before = (path.read_bytes(), man.read_text())
    want = f"[{stage}/{name}] {name}: 0 rows ({c.empty_cause})"
    for empty in ([], c.schema.empty_table()):
        with pytest.raises(ArtifactError) as e:
            store.write(stage, name, empty)
        assert str(e.value) == want and "\n" not in want and phrase in want
    with pytest.raises(ArtifactError) as e, store.stream(stage, name) as s:  # streamed: at the commit
        s.add([])
        s.commit()
    assert str(e.value) == want
    assert (path.read_bytes(), man.read_text()) == before and not store.stray_temp_files(stage)
    assert len(store.rows(earlier)) == 1
    # under another artifact name the contract is the same: online training's episodes
    with pytest.raises(ArtifactError, match=rf"^\[train/online_{name}\] {name}: 0 rows \("):
        store.write("train", f"online_{name}", [], contract=name)
    assert not store.exists(f"train/online_{name}.parquet")


@pytest.mark.parametrize("name", ["turns", "leakage", "eval_contrasts"])
def test_an_artifact_that_may_be_empty_is_written_empty(tmp_path, name):
    store = ArtifactStore(tmp_path)
    assert store.write("a", name, []).rows == 0 and store.rows(("a", name)) == []
    with store.stream("b", name) as s:
        s.add([])
        ref = s.commit()
    assert ref.rows == 0 and ref.sha256 == store.ref("a", name).sha256
