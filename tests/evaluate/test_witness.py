"""The Prefect server as witness (issue 20, item 2): the plan hash and chain head recorded as
artifacts when they are made; ``verify --witness`` checks the run against the earliest ones."""

from __future__ import annotations

import os
import shutil

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.evaluate.signing import KEY_ENV

pytestmark = pytest.mark.slow  # a temporary Prefect server (tens of seconds)


def test_witness_records_and_catches_a_forger(tmp_path):
    from prefect.testing.utilities import prefect_test_harness

    from tests.evaluate.test_signing import _forge
    from tests.evaluate.test_stage import _cfg, _run
    from tasks.evaluate.seal import plan_hash
    from tasks.evaluate.witness import artifact_key, record
    from schemas import ArtifactStore

    os.environ[KEY_ENV] = str(tmp_path / "signer.pem")
    try:
        with prefect_test_harness():
            _run(tmp_path, _cfg(infra_retries=1, bootstrap_resamples=200))
            rd = tmp_path / "run"
            ok = CliRunner().invoke(app, ["verify", str(rd), "--witness"])
            assert ok.exit_code == 0 and "witnessed by the Prefect API: plan at" in ok.output, ok.output
            forged = tmp_path / "forged"
            shutil.copytree(rd, forged)
            head = _forge(forged, "recompute")
            ph = plan_hash(ArtifactStore(forged).read_json("evaluate/plan.json"))
            record("head", ph, head, "SHA256:forger")  # a later version under the same key
            bad = CliRunner().invoke(app, ["verify", str(forged), "--witness"])
            assert bad.exit_code == 1, bad.output
            out = bad.output.replace("\n", " ")
            assert "head.sig" in out or f"witness {artifact_key('head', ph)}" in out, out
            # the signature check alone would not see a re-signed run; the witness does
            from tasks.evaluate.witness import check_witness
            from tasks.evaluate.seal import SealError
            with pytest.raises(SealError, match=f"witness {artifact_key('head', ph)}: the Prefect server recorded"):
                check_witness(ph, head)
    finally:
        os.environ.pop(KEY_ENV, None)
