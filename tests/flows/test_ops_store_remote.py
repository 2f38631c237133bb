"""The artifact store on fsspec URLs: ``file://`` on another folder, and ``s3://`` against a real
S3 API served locally by moto's server (``moto[server]``, HTTP on loopback; client: s3fs). A whole
tiny-model run goes to the S3 store (run folder, Prefect results and cache records) and a rerun
finds every stage Cached."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from schemas import ArtifactError, ArtifactStore
from tests.facilities import bwrap_missing, require

def _kl_rows():
    from tasks.train.kl_check import kl_check_table

    return kl_check_table(vocab=2, length=1, samples=64, seed=0)


def test_file_url_store_on_another_folder(tmp_path):
    url = f"file://{tmp_path / 'elsewhere' / 'run'}"
    store = ArtifactStore(url)
    assert store.is_local
    rows = _kl_rows()
    ref = store.write("kl_check", "kl_check", rows, config_hash="c")
    data = (tmp_path / "elsewhere/run/kl_check/kl_check.parquet").read_bytes()
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert store.rows(ref) == ArtifactStore(tmp_path / "elsewhere/run").rows(ref)
    (tmp_path / "elsewhere/run/kl_check/.tmp-dead-kl_check.parquet").write_bytes(b"half")
    assert store.stray_temp_files("kl_check") == ["kl_check/.tmp-dead-kl_check.parquet"]
    assert store.remove_stray_temp_files("kl_check") == ["kl_check/.tmp-dead-kl_check.parquet"]
    assert store.stray_temp_files("kl_check") == []


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on loopback, the environment s3fs/botocore read (endpoint, fake keys),
    and a fresh bucket. Yields the bucket name."""
    pytest.importorskip("s3fs", reason="s3fs not installed (pip install -e '.[s3,s3-test]')")
    pytest.importorskip("moto.server", reason="moto[server] not installed (pip install -e '.[s3,s3-test]')")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("harnessrl-runs")
    yield "harnessrl-runs"
    s3fs.S3FileSystem.clear_instance_cache()
    mp.undo()
    server.stop()


def test_s3_store_roundtrip_and_hash_check(s3):
    store = ArtifactStore(f"s3://{s3}/unit")
    assert not store.is_local
    rows = _kl_rows()
    ref = store.write("kl_check", "kl_check", rows, config_hash="c")
    assert store.rows(ref) == rows
    assert store.manifest("kl_check", "kl_check")["sha256"] == ref.sha256
    assert store.stray_temp_files("kl_check") == []  # the temp object was moved, not left behind
    store.fs.pipe(store._abs("kl_check/kl_check.parquet"), b"not the same bytes")
    with pytest.raises(ArtifactError, match="differs from the recorded"):
        store.read(ref)


@pytest.mark.slow
def test_tiny_run_on_s3_then_cached(s3, tiny_model_dir, prefect_harness, tmp_path):
    require("bubblewrap", bwrap_missing())
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.pipeline import pipeline
    from tasks.config import RunConfig
    from tests.flows.test_ops_faults import tiny_config

    cfg = RunConfig.model_validate(tiny_config(tiny_model_dir, name="s3run"))
    url = f"s3://{s3}/runs/s3run"
    first = pipeline(cfg, url)
    assert [first[s]["state"] for s in first] == ["Completed"] * 5
    store = ArtifactStore(url)
    assert len(store.rows(("rollout", "episodes"))) == 6
    assert store.fs.exists(f"{s3}/runs/s3run/train/checkpoints.manifest.json")
    assert store.fs.ls(f"{s3}/runs/s3run/.prefect")  # Prefect results live in the bucket too
    again = pipeline(cfg, url)
    assert [again[s]["state"] for s in again] == ["Cached"] * 5
    # the same rows as a local run of the same config
    local = pipeline(cfg, str(tmp_path / "local"))
    for s in first:
        assert {k: v.sha256 for k, v in first[s]["outputs"].items()} == \
               {k: v.sha256 for k, v in local[s]["outputs"].items()}, s
    res = CliRunner().invoke(app, ["status", url], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert res.output.count(" done ") == 5
    shutil.rmtree(tmp_path / "local")
