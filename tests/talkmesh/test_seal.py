"""The seal of a TalkMesh run (tasks.talkmesh.seal): a tiny findings run verifies, and every way a
forger would change it (a result, a row, the plan, the findings table, the signer, the adapter)
is caught by ``verify_talkmesh`` and by ``harnessrl verify``."""

from __future__ import annotations

import json
import shutil

import pytest

from schemas import ArtifactStore
from tasks.evaluate.seal import SealError, seal_rows
from tasks.talkmesh.seal import PLAN, build_plan, planned_conditions, sealed_rows, verify_talkmesh
from tests.talkmesh.test_findings import tiny_findings  # noqa: F401  (the module-scoped run fixture)


@pytest.fixture()
def run_copy(tiny_findings, tmp_path):  # noqa: F811
    """A copy of the tiny findings run to tamper with: ``(cfg, folder)``."""
    cfg, rd, _ = tiny_findings
    dst = tmp_path / "run"
    shutil.copytree(rd, dst)
    return cfg, dst


def _rewrite(store, rows):
    """Write sealed rows back as a forger would, with the store's own writer (manifest included)."""
    store.write("talkmesh", "talkmesh_sealed", rows, extra={"plan_hash": rows[0]["plan_hash"]})


def test_the_tiny_run_verifies_and_its_rows_follow_the_plan(tiny_findings):  # noqa: F811
    from tasks.evaluate.signing import fingerprint

    cfg, rd, _ = tiny_findings
    store = ArtifactStore(rd)
    plan = store.read_json(PLAN)
    rep = verify_talkmesh(store)
    rows = store.raw_rows("talkmesh", "talkmesh_sealed")
    # 3 test problems x 8 samples, then mesh-base (4 agents) and mesh-base-n2, 2 repeats x 3 problems each
    assert [r["kind"] for r in rows] == ["proposal"] * 24 + ["mesh"] * 12
    assert [(r["condition"], r["repeat"]) for r in rows[24:]] == \
        [("mesh-base", 0)] * 3 + [("mesh-base", 1)] * 3 + [("mesh-base-n2", 0)] * 3 + [("mesh-base-n2", 1)] * 3
    assert rep.rows == 36 and rep.head == rows[-1]["seal_hash"]
    assert rep.fingerprint == fingerprint((rd / "talkmesh" / "signing.pub").read_bytes())
    # FirstFourRight: samples 0-3 right, 4-7 wrong, on every problem
    assert [r["correct"] for r in rows[:8]] == [True] * 4 + [False] * 4
    assert plan["test_problems"] == [r["problem_id"] for r in rows[:24:8]]
    assert plan["conditions"] == planned_conditions(cfg.talkmesh, False)
    assert plan["size_conditions"] == {"2": "mesh-base-n2", "4": "mesh-base"}


def test_a_changed_result_is_caught(run_copy):
    _, rd = run_copy
    store = ArtifactStore(rd)
    rows = store.raw_rows("talkmesh", "talkmesh_sealed")
    i = next(i for i, r in enumerate(rows) if r["kind"] == "mesh" and not r["correct"])
    rows[i] = {**rows[i], "correct": True}
    _rewrite(store, rows)
    with pytest.raises(SealError, match=f"row {i} .*seal_hash does not match"):
        verify_talkmesh(store)
    # re-chained with the product's own function: the chain holds, the signed head does not
    _rewrite(store, seal_rows([{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")}
                               for r in rows], rows[0]["plan_hash"]))
    with pytest.raises(SealError, match="talkmesh/head.sig: signs"):
        verify_talkmesh(store)


def test_a_dropped_repeat_resigned_by_another_key_is_caught(run_copy, tmp_path, monkeypatch):
    """The forger drops the worse repeat, re-chains and re-signs with their own key: the rows no
    longer cover the plan; and a fully consistent forgery under their key fails against the
    expected public key."""
    from tasks.evaluate.signing import KEY_ENV, load_or_create_key, sign
    from tasks.talkmesh.seal import HEAD_SIG as TALKMESH_HEAD_SIG, PLAN_SIG as TALKMESH_PLAN_SIG

    _, rd = run_copy
    store = ArtifactStore(rd)
    expected = (rd / "talkmesh" / "signing.pub").read_bytes()
    rows = store.raw_rows("talkmesh", "talkmesh_sealed")
    kept = [r for r in rows if not (r["condition"] == "mesh-base" and r["repeat"] == 1)]
    resealed = seal_rows([{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")}
                          for r in kept], rows[0]["plan_hash"])
    _rewrite(store, resealed)
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "forger.pem"))
    forger = load_or_create_key()
    sign(store, TALKMESH_PLAN_SIG, rows[0]["plan_hash"], forger)
    sign(store, TALKMESH_HEAD_SIG, resealed[-1]["seal_hash"], forger)
    with pytest.raises(SealError, match=r"row 27: \('mesh', 'mesh-base-n2', 0, .*the plan calls for \('mesh', "
                                        r"'mesh-base', 1"):
        verify_talkmesh(store)
    # the original rows, re-signed by the forger: everything holds but the signer
    _rewrite(store, rows)
    sign(store, TALKMESH_HEAD_SIG, rows[-1]["seal_hash"], forger)
    assert verify_talkmesh(store).rows == len(rows)
    with pytest.raises(SealError, match="is not the expected key"):
        verify_talkmesh(store, public_key=expected)


def test_an_edited_plan_or_findings_table_is_caught(run_copy):
    _, rd = run_copy
    store = ArtifactStore(rd)
    # the findings table, rewritten with a better estimate
    found = store.raw_rows("talkmesh", "talkmesh_findings")
    found[0] = {**found[0], "estimate": found[0]["estimate"] + 0.25, "verdict": "reproduced"}
    store.write("talkmesh", "talkmesh_findings", found)
    with pytest.raises(SealError, match="talkmesh_findings.parquet row 0: estimate="):
        verify_talkmesh(store)
    # a wider margin written into the plan after the run
    plan = json.loads((rd / PLAN).read_text())
    plan["findings"]["rules"][0]["margin"] = 0.9
    (rd / PLAN).write_text(json.dumps(plan))
    with pytest.raises(SealError, match="the plan was edited"):
        verify_talkmesh(store)


def test_an_edited_vote_curve_is_caught(run_copy):
    _, rd = run_copy
    store = ArtifactStore(rd)
    # the vote baseline every mesh is read against, lowered at its largest k
    curves = store.raw_rows("talkmesh", "talkmesh_curves")
    i = max(range(len(curves)), key=lambda j: (curves[j]["method"] == "majority", curves[j]["k"]))
    curves[i] = {**curves[i], "accuracy": curves[i]["accuracy"] - 0.1}
    store.write("talkmesh", "talkmesh_curves", curves)
    with pytest.raises(SealError, match=f"talkmesh_curves.parquet row {i}: accuracy="):
        verify_talkmesh(store)


def test_verify_cli_on_a_talkmesh_run(run_copy):
    from typer.testing import CliRunner

    from flows.cli import app

    _, rd = run_copy
    (rd / "evaluate").mkdir(exist_ok=True)  # as a real run's freeze leaves it (the pre-registration's key)
    (rd / "evaluate" / "signing.pub").write_bytes((rd / "talkmesh" / "signing.pub").read_bytes())
    res = CliRunner().invoke(app, ["verify", str(rd)])
    assert res.exit_code == 0 and "verified: plan" in res.output and "36 sealed rows" in res.output, res.output
    res = CliRunner().invoke(app, ["verify", str(rd), "--witness"])
    assert res.exit_code == 2 and "not built for a TalkMesh run" in res.output
    (rd / "talkmesh" / "talkmesh_sealed.parquet").unlink()
    res = CliRunner().invoke(app, ["verify", str(rd)])
    assert res.exit_code == 2 and "talkmesh_sealed.parquet is missing" in res.output


def test_a_resumed_run_keeps_its_plan_and_another_plan_is_refused(tiny_findings, tmp_path):  # noqa: F811
    from tasks.talkmesh.seal import commit_plan

    _, rd, _ = tiny_findings
    dst = tmp_path / "run"
    shutil.copytree(rd, dst)
    store = ArtifactStore(dst)
    plan = store.read_json(PLAN)
    ph, _ = commit_plan(store, plan)
    assert ph == (dst / "talkmesh" / "plan.sha256").read_text().strip()
    with pytest.raises(ValueError, match="a sealed run is not re-planned"):
        commit_plan(store, {**plan, "samples": plan["samples"] + 1})


def test_sealed_rows_put_the_adapter_before_the_first_trained_mesh():
    res = [{"problem_id": "p", "answer": "1", "correct": True, "outputs_spent": 3}]
    rows = sealed_rows("h" * 64, ["p"], [[("1", True, 0.9), (None, False, 0.0)]],
                       [("mesh-base", 0, res), ("mesh-talk", 0, res)], "a" * 64, 1)
    assert [(r["kind"], r["condition"]) for r in rows] == [("proposal", None), ("proposal", None),
                                                           ("mesh", "mesh-base"), ("state", None),
                                                           ("mesh", "mesh-talk")]
    assert rows[3]["sha256"] == "a" * 64 and rows[3]["path"] == "talkmesh/talk_adapter"
    assert rows[1]["answer"] is None and rows[1]["confidence"] == 0.0
    plan = build_plan(config_hash="c", tasks_sha256="t", harnesses_sha256="h", model="m", harness="direct",
                      test_problems=["p"], samples=2, proposal_seed=1, size_conditions={3: "mesh-talk"},
                      conditions=[{"condition": "mesh-base", "agents": 3, "repeats": 1, "talk": "base"},
                                  {"condition": "mesh-talk", "agents": 3, "repeats": 1, "talk": "trained"}],
                      vote_seed=2, resamples=1, findings=None, findings_seed=3, preregistration=None)
    from tasks.talkmesh.seal import _expected_keys

    assert [k[0] for k in _expected_keys(plan)] == [r["kind"] for r in rows]
