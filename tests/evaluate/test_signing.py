"""Signed seals (issue 20, item 2): the forger who re-seals a run with the product's own functions
fails ``harnessrl verify``, and so does one who also swaps the run's public key, given the
expected key."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas import ArtifactStore
from tasks.evaluate.seal import plan_hash, seal_rows
from tasks.evaluate.signing import (HEAD_SIG, KEY_ENV, PLAN_SIG, PUBLIC_KEY, fingerprint, load_or_create_key,
                                    public_pem, sign)
from tasks.evaluate.exports import swebench_files
from tasks.evaluate.seal import SealError
from tasks.evaluate.stats import cell_table, contrast_table
from tasks.evaluate.verify import PLAN, verify_run


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    from tests.evaluate.test_stage import _cfg, _run

    tmp = tmp_path_factory.mktemp("signed")
    key = tmp / "keys" / "signer.pem"
    old = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(key)
    try:
        _run(tmp, _cfg(infra_retries=1, bootstrap_resamples=200))
    finally:
        if old is None:
            os.environ.pop(KEY_ENV)
        else:
            os.environ[KEY_ENV] = old
    pub = tmp / "signer.pub"
    pub.write_bytes(public_pem(load_or_create_key(key)))
    return tmp / "run", key, pub


def _copy(signed, tmp_path):
    rd = tmp_path / "copy"
    shutil.copytree(signed[0], rd)
    return rd


def _verify(rd, *args):
    r = CliRunner().invoke(app, ["verify", str(rd), *args])
    return r.exit_code, r.output.replace("\n", " ")


def test_key_created_outside_the_run_with_mode_0600_and_public_key_in_the_run(signed):
    rd, key, pub = signed
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and not str(key).startswith(str(rd))
    assert (rd / PUBLIC_KEY).read_bytes() == pub.read_bytes()
    code, out = _verify(rd, "--public-key", str(pub))
    assert code == 0 and f"signed by {fingerprint(pub.read_bytes())}" in out, out


def test_a_key_readable_by_others_is_refused(tmp_path):
    p = tmp_path / "k.pem"
    load_or_create_key(p)
    p.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        load_or_create_key(p)


def _forge(rd, stats: str):
    """Flip one result, re-seal the chain with seal_rows, rewrite evaluations (and manifest) with
    the store's own write, recompute the SWE-bench exports, then recompute the statistics
    (``stats="recompute"``) or delete them."""
    store = ArtifactStore(rd)
    plan = store.read_json(PLAN)
    rows = store.raw_rows("evaluate", "evaluations")
    i = next(i for i, r in enumerate(rows) if r["status"] == "unresolved")
    rows[i].update(status="resolved", resolved=True, reward=1.0)
    bare = [{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")} for r in rows]
    forged = seal_rows(bare, plan_hash(plan))
    store.write("evaluate", "evaluations", forged, extra={"plan_hash": plan_hash(plan)})
    for rel, data in swebench_files("sealed", plan, forged).items():
        store.write_bytes(rel, data)
    if stats == "recompute":
        cells = cell_table(forged, plan, plan["min_graded_fraction"])
        store.write("evaluate", "eval_cells", cells)
        store.write("evaluate", "eval_contrasts", contrast_table(forged, plan, cells, alpha=plan["alpha"],
                                                                 resamples=plan["bootstrap_resamples"],
                                                                 power=plan["power"]))
    else:
        for n in ("eval_cells", "eval_contrasts"):
            (rd / f"evaluate/{n}.parquet").unlink()
            (rd / f"evaluate/{n}.manifest.json").unlink()
    return forged[-1]["seal_hash"]


@pytest.mark.parametrize("stats", ["recompute", "delete"])
def test_forger_who_reseals_fails_verify_naming_the_head_signature(signed, tmp_path, stats):
    rd = _copy(signed, tmp_path)
    head = _forge(rd, stats)
    for args in ([], ["--public-key", str(signed[2])]):
        code, out = _verify(rd, *args)
        assert code == 1, out
        assert f"{HEAD_SIG}: signs" in out and f"the run's is {head[:16]}" in out, out
    if stats == "recompute":  # chain, statistics and exports all consistent: only the signature tells
        with pytest.raises(SealError, match=f"{HEAD_SIG}: signs"):
            verify_run(ArtifactStore(rd))


def test_forger_who_also_swaps_the_public_key_fails_given_the_expected_key(signed, tmp_path):
    rd = _copy(signed, tmp_path)
    store = ArtifactStore(rd)
    head = _forge(rd, "recompute")
    own = load_or_create_key(tmp_path / "forger.pem")
    sign(store, PLAN_SIG, (rd / "evaluate/plan.sha256").read_text().strip(), own)
    sign(store, HEAD_SIG, head, own)
    code, out = _verify(rd, "--public-key", str(signed[2]))
    assert code == 1 and f"{PUBLIC_KEY}: key" in out and "is not the expected key" in out, out


def test_signature_over_the_right_hash_by_another_key_does_not_verify(signed, tmp_path):
    rd = _copy(signed, tmp_path)
    other = load_or_create_key(tmp_path / "other.pem")
    store = ArtifactStore(rd)
    sign(store, HEAD_SIG, store.raw_rows("evaluate", "evaluations")[-1]["seal_hash"], other)
    (rd / PUBLIC_KEY).write_bytes(signed[2].read_bytes())  # the signer's key back in place
    code, out = _verify(rd)
    assert code == 1 and f"{HEAD_SIG}: the signature does not verify" in out, out


def test_missing_signature_and_bad_public_key_option(signed, tmp_path):
    rd = _copy(signed, tmp_path)
    (rd / PLAN_SIG).unlink()
    code, out = _verify(rd)
    assert code == 1 and f"{PLAN_SIG}: missing" in out, out
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    code, out = _verify(rd, "--public-key", str(bad))
    assert code == 2 and "--public-key=" in out and "not an Ed25519 public key" in out, out


def test_an_application_signature_is_registered_once():
    """tasks.talkmesh.seal registers its files on import; registering one of them (or a core file)
    with another context is refused, the same registration again is not."""
    from tasks.evaluate.signing import register_signature
    from tasks.talkmesh.seal import PLAN_SIG as TM_PLAN_SIG, PUBLIC_KEY as TM_KEY

    register_signature(TM_PLAN_SIG, b"harnessrl-talkmesh-plan:", TM_KEY)
    with pytest.raises(ValueError, match="already registered differently"):
        register_signature(TM_PLAN_SIG, b"harnessrl-plan:", TM_KEY)
    with pytest.raises(ValueError, match="already registered differently"):
        register_signature(HEAD_SIG, b"other:", PUBLIC_KEY)
