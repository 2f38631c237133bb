"""``harnessrl verify`` on another machine than the one that wrote the statistics: one line names
both; hashes, rows, exports and every kernel-independent statistic stay exact; only the values
that pass through BLAS or libm (eval_contrasts' mdd, a p1_predictor_gap finding's estimate and
interval) are compared within tolerance, and only then."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.machine import describe, light_facts
from tasks.config import RunConfig
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.stage import run_evaluate
from tests.evaluate.test_stage import _rewrite, _store

REPO = Path(__file__).resolve().parents[2]
HARNESSES = ["direct", "react-python", "boxed", "answer-tag"]
TABLES = ("eval_cells", "eval_contrasts", "eval_findings")


def _cfg(margin=0.0):
    contrasts = [{"name": "final-minus-base-direct", "a": {"checkpoint": "final", "harness": "direct"},
                  "b": {"checkpoint": "base", "harness": "direct"}}]
    findings = [{"name": "p1-gap", "paper": "P1", "measure": "p1_predictor_gap", "claim": "increase",
                 "headline": "C - M predicts the gain best", "margin": margin,
                 "cells": [{"checkpoint": "final", "harness": h} for h in HARNESSES]}]
    return RunConfig.model_validate({
        "name": "machine", "seed": 3, "suites": [{"name": "basic_arithmetic", "size": 40, "seed": 2}],
        "split": {"test_fraction": 0.5, "disjoint": True}, "harnesses": ["direct"],
        "evaluate": {"attempts": 2, "harnesses": HARNESSES, "bootstrap_resamples": 200,
                     "contrasts": contrasts, "findings": findings}, "analyze": {"ceiling_k": 2}})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("machine")
    cfg = _cfg()
    store, refs, *_ = _store(tmp, cfg)
    run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(
        p_resolve={"direct": 0.7, "react-python": 0.2, "boxed": 0.5, "answer-tag": 0.4}, seed=5))
    (p1,) = store.rows(("evaluate", "eval_findings"))
    assert p1["measure"] == "p1_predictor_gap" and p1["estimate"] is not None and p1["ci_low"] is not None, p1
    return Path(store.root)


def _copy(run, tmp_path, machine=None):
    """A copy of the run; with ``machine``, its statistics' manifests say that machine wrote them."""
    rd = tmp_path / "copy"
    shutil.copytree(run, rd)
    if machine is not None:
        for t in TABLES:
            p = rd / "evaluate" / f"{t}.manifest.json"
            m = json.loads(p.read_text())
            m["machine"] = machine
            p.write_text(json.dumps(m))
    return rd


def _nudge(rd, table, column, by=None, measure=None):
    """Move ``column`` of the first row of ``table`` (of ``measure`` when given) to the next float
    up (``by``: times 1 + by instead)."""
    def fn(rows):
        r = next(r for r in rows if measure is None or r.get("measure") == measure)
        r[column] = r[column] * (1 + by) if by else math.nextafter(r[column], math.inf)
    _rewrite(rd / "evaluate" / f"{table}.parquet", fn)


def _verify(rd):
    r = CliRunner().invoke(app, ["verify", str(rd)])
    return r.exit_code, r.output.replace("\n", " ")


def _intel():
    return {**light_facts(), "cpu": {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Platinum 8480+",
                                     "flags": ["amx_tile", "avx2", "avx512f", "fma"], "arch": "x86_64"}}


def test_on_the_recording_machine_every_recomputed_value_is_exact(run, tmp_path):
    rd = _copy(run, tmp_path)
    code, out = _verify(rd)
    assert code == 0 and "recorded on" not in out, out
    _nudge(rd, "eval_findings", "estimate")  # one ulp, on a kernel-dependent value: still a difference here
    code, out = _verify(rd)
    assert code == 1 and "eval_findings.parquet row 0: estimate=" in out, out


def test_on_another_machine_one_line_names_both_and_only_kernel_dependent_values_get_a_tolerance(run, tmp_path):
    rd = _copy(run, tmp_path, _intel())
    code, out = _verify(rd)
    assert code == 0, out
    assert describe(_intel()).startswith("Intel(R) Xeon(R) Platinum 8480+ (amx_tile; numpy ")
    assert (f"recorded on {describe(_intel())}, recomputing on {describe(light_facts())}: recomputed statistics may differ in the last bits; sealed hashes are checked as bytes") in out, out
    assert "eval_contrasts' mdd (libm log)" in out and "p1_predictor_gap finding's estimate and interval" in out
    # last-bit differences where BLAS or libm decide them: accepted on another machine
    _nudge(rd, "eval_findings", "estimate")
    _nudge(rd, "eval_findings", "ci_low")
    _nudge(rd, "eval_contrasts", "mdd")
    code, out = _verify(rd)
    assert code == 0, out
    # ... but nothing beyond rounding, and no other value
    far = _copy(run, tmp_path / "far", _intel())
    _nudge(far, "eval_findings", "estimate", by=1e-6)
    code, out = _verify(far)
    assert code == 1 and "eval_findings.parquet row 0: estimate=" in out and "beyond the tolerance" in out, out
    cells = _copy(run, tmp_path / "cells", _intel())
    _nudge(cells, "eval_contrasts", "estimate")  # the paired bootstrap: numpy sums, exact anywhere
    code, out = _verify(cells)
    assert code == 1 and "eval_contrasts.parquet row 0: estimate=" in out and "beyond" not in out, out


def test_a_run_whose_manifests_record_no_machine_is_said_so(run, tmp_path):
    rd = _copy(run, tmp_path)
    for t in TABLES:
        p = rd / "evaluate" / f"{t}.manifest.json"
        m = json.loads(p.read_text())
        del m["machine"]
        p.write_text(json.dumps(m))
    code, out = _verify(rd)
    assert code == 0 and "recorded on an unrecorded machine (manifests written before machines were recorded), " \
        f"recomputing on {describe(light_facts())}" in out, out


def test_verify_under_another_openblas_core_type_names_it_and_verifies(run, tmp_path):
    import threadpoolctl

    here = [p["architecture"] for p in threadpoolctl.threadpool_info() if p["internal_api"] == "openblas"]
    if not here:
        pytest.skip("numpy's BLAS is not OpenBLAS: no core type to force")
    forced = "Sandybridge" if here[0] != "Sandybridge" else "Prescott"
    prog = "import sys\nsys.argv = ['harnessrl', 'verify', sys.argv[1]]\nfrom flows.cli import app\napp()\n"
    r = subprocess.run([sys.executable, "-c", prog, str(run)], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OPENBLAS_CORETYPE": forced})
    out = r.stdout.replace("\n", " ")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{here[0]}), recomputing on " in out and f"{forced}; OPENBLAS_CORETYPE={forced})" in out, out
    assert "verified:" in out


@pytest.fixture(scope="module")
def at_margin(run, tmp_path_factory):
    """The same run with the p1 finding's margin set to its interval's upper end, exactly: the end
    sits on the margin, where another BLAS kernel's last bits decide the verdict."""
    (p1,) = pq.read_table(run / "evaluate/eval_findings.parquet").to_pylist()
    tmp = tmp_path_factory.mktemp("at-margin")
    cfg = _cfg(margin=p1["ci_high"])
    store, refs, *_ = _store(tmp, cfg)
    run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(
        p_resolve={"direct": 0.7, "react-python": 0.2, "boxed": 0.5, "answer-tag": 0.4}, seed=5))
    return Path(store.root)


def test_a_p1_interval_end_at_the_margin_may_change_its_verdict_on_another_machine_only(at_margin, tmp_path):
    """The p1 interval ends on the margin: on another BLAS kernel that end may land a few ulps
    below it and the rule says "not reproduced"; verify then asks that the recorded verdict follow
    from the recorded numbers, not that it be the same."""
    from tasks.evaluate.findings import verdict

    run = at_margin
    (p1,) = pq.read_table(run / "evaluate/eval_findings.parquet").to_pylist()
    assert p1["ci_high"] == p1["margin"] > 0 and p1["verdict"] == "inconclusive", p1

    def other_kernel(rows):  # what another kernel could have written: the end a few ulps below the margin
        r = rows[0]
        r["ci_high"] = r["margin"] - 4 * math.ulp(r["margin"])
        r["verdict"], r["reason"] = verdict(r["claim"], r["estimate"], r["ci_low"], r["ci_high"], r["margin"],
                                            r["control_estimate"])
        assert r["verdict"] == "not reproduced"

    flipped = _copy(run, tmp_path / "flipped", _intel())
    _rewrite(flipped / "evaluate/eval_findings.parquet", other_kernel)
    code, out = _verify(flipped)
    assert code == 0, out
    same = _copy(run, tmp_path / "same")
    _rewrite(same / "evaluate/eval_findings.parquet", other_kernel)
    code, out = _verify(same)
    assert code == 1 and "eval_findings.parquet row 0: ci_high=" in out, out
    # a verdict the recorded numbers do not give is caught on any machine
    forged = _copy(run, tmp_path / "forged", _intel())
    _rewrite(forged / "evaluate/eval_findings.parquet", lambda rows: rows[0].update(verdict="reproduced"))
    code, out = _verify(forged)
    assert code == 1 and "eval_findings.parquet row 0: verdict='reproduced'" in out, out


def test_the_note_for_a_talkmesh_run_says_its_tables_stay_exact(tmp_path):
    from schemas import ArtifactStore
    from tasks.registries.applications import application
    from tasks.talkmesh.publish import TALKMESH_TABLES

    recompute_note = application("talkmesh").recompute_note  # harnessrl verify reaches it through the registry

    store = ArtifactStore(tmp_path)
    assert recompute_note(store) is None  # nothing recorded, nothing recomputed
    for t in TALKMESH_TABLES:
        store.write_json(f"{t}.manifest.json", {"sha256": "0" * 64, "machine": light_facts()})
    assert recompute_note(store) is None  # this machine wrote them
    store.write_json(f"{TALKMESH_TABLES[1]}.manifest.json", {"sha256": "0" * 64, "machine": _intel()})
    note = recompute_note(store)
    assert note == (f"recorded on {describe(_intel())}, recomputing on {describe(light_facts())}: recomputed "
                    "statistics may differ in the last bits; sealed hashes are checked as bytes; talkmesh_findings "
                    "and talkmesh_curves use no BLAS or libm (float64 sums, sorts, seeded draws) and are still "
                    "compared exactly")
