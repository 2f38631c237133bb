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
