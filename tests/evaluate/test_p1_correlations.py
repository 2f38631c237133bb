"""P1's correlations table: exact values on a hand-made design, n/a, direction, determinism,
the seed and task resampling, and the findings command printing and writing it."""

import numpy as np
import pytest
from scipy import stats

from tasks.evaluate.findings import p1_cells
from tasks.evaluate.p1_correlations import _Design, correlations, markdown_table, p1_correlation_table
from tasks.hashing import seed_from
from tests.evaluate.test_stats import _contrast_rows

# 5 cells (arm_i under h_i), 2 tasks x 2 attempts. Base resolved per task, and C (pass@2), M (C - pass@1):
#   h0 [0, 0] p1 0     C 0    M 0      | h1 [1, 0] p1 .25 C .5 M .25 | h2 [1, 1] p1 .5 C 1 M .5
#   h3 [2, 0] p1 .5    C .5   M 0      | h4 [2, 1] p1 .75 C 1  M .25
# trained return: [.25, .5, .75, 1, .5]; gain = return - base p1: [.25, .25, .25, .5, -.25]
BASE = [[0, 0], [1, 0], [1, 1], [2, 0], [2, 1]]
TRAINED = [[1, 0], [1, 1], [2, 1], [2, 2], [2, 0]]
C = np.array([0, .5, 1, .5, 1])
M = np.array([0, .25, .5, 0, .25])
RET = np.array([.25, .5, .75, 1, .5])
GAIN = np.array([.25, .25, .25, .5, -.25])


def _plan(cells, resamples=400, seed=7, arm_seeds=None, suite_of=None, n_findings=2):
    fs = [{"name": "p1-gain", "paper": "P1", "measure": "p1_predictor_gap", "target": "gain", "cells": cells},
          {"name": "p1-return", "paper": "P1", "measure": "p1_predictor_gap", "target": "return", "cells": cells},
          {"name": "other", "paper": "P4", "measure": "contrast"}][:n_findings]
    return {"seed": seed, "alpha": 0.05, "attempts": 2, "bootstrap_resamples": resamples, "checkpoints": [],
            "harnesses": [], "findings": fs, "arm_seeds": arm_seeds or {}, "suite_of": suite_of or {}}


def _hand():
    rates = {}
    for i, (b, t) in enumerate(zip(BASE, TRAINED)):
        rates[("base", f"h{i}")] = b
        rates[(f"arm{i}", f"h{i}")] = t
    return _contrast_rows(rates), [{"checkpoint": f"arm{i}", "harness": f"h{i}"} for i in range(5)]


def _row(out, target, pred):
    (r,) = [x for x in out if x["target"] == target and x["predictor"] == pred]
    return r


def test_the_table_by_hand():
    rows, cells = _hand()
    pts = p1_cells(rows, cells, 2)
    assert np.allclose(pts["C"], C) and np.allclose(pts["M"], M)
    assert np.allclose(pts["return"], RET) and np.allclose(pts["gain"], GAIN)
    out = p1_correlation_table(rows, _plan(cells))
    assert [(r["target"], r["predictor"]) for r in out] == [(t, p) for t in ("gain", "return")
                                                           for p in ("C", "M", "C_minus_M")]
    # C - M = [0, .25, .5, .5, .75] against the return: sxy .175, sxx = syy = .325 -> r = 7/13;
    # average ranks [1, 2, 3.5, 3.5, 5] and [1, 2.5, 4, 5, 2.5]: 5 / 9.5 -> rho = 10/19
    r = _row(out, "return", "C_minus_M")
    assert r["n_cells"] == 5 and r["na_reason"] == "" and r["findings"] == "p1-gain, p1-return"
    assert r["r"] == pytest.approx(7 / 13) and r["r2"] == pytest.approx(49 / 169) and r["slope"] == pytest.approx(7 / 13)
    assert r["rho"] == pytest.approx(10 / 19)
    # one seed per arm: the task draws alone make the interval, around the point
    assert r["r2_ci_low"] < r["r2"] < r["r2_ci_high"] and r["rho_ci_low"] < r["rho"] < r["rho_ci_high"]
    # every other row against scipy
    for target, y in (("gain", GAIN), ("return", RET)):
        for pred, x in (("C", C), ("M", M), ("C_minus_M", C - M)):
            r = _row(out, target, pred)
            assert r["r"] == pytest.approx(stats.pearsonr(x, y).statistic), (target, pred)
            assert r["r2"] == pytest.approx(stats.linregress(x, y).rvalue ** 2)
            assert r["slope"] == pytest.approx(stats.linregress(x, y).slope)
            assert r["rho"] == pytest.approx(stats.spearmanr(x, y).statistic), (target, pred)
            assert r["level"] == pytest.approx(1 - 0.05 / 2) and r["interval"] == "task"
            for s in ("r2", "r", "rho"):
                assert r[f"{s}_ci_low"] <= r[f"{s}_ci_high"]
            assert r["resamples_valid"] > 200 and r["cell_resamples_valid"] > 200


def test_a_predictor_that_orders_the_cells_as_the_target_has_rho_one():
    # the trained return rises with C - M, but not on a line: rho 1, R^2 below 1
    rates = {}
    base = [[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [2, 1, 1, 0], [2, 2, 1, 1]]  # base pass@1 1/8 steps
    trained = [[0, 0, 0, 0], [2, 0, 0, 0], [2, 2, 2, 0], [2, 2, 2, 1], [2, 2, 2, 2]]
    for i, (b, t) in enumerate(zip(base, trained)):
        rates[("base", f"h{i}")], rates[(f"a{i}", f"h{i}")] = b, t
    cells = [{"checkpoint": f"a{i}", "harness": f"h{i}"} for i in range(5)]
    out = p1_correlation_table(_contrast_rows(rates), _plan(cells))
    r = _row(out, "return", "C_minus_M")
    assert r["rho"] == pytest.approx(1.0) and r["r"] > 0 and r["r2"] < 0.99
    assert r["rho_cell_ci_high"] == pytest.approx(1.0)  # any resample of these cells keeps the order
    # the reversed order: rho -1
    rev = {("base", f"h{i}"): b for i, b in enumerate(base)} | {(f"a{i}", f"h{i}"): t for i, t in
                                                                enumerate(reversed(trained))}
    assert _row(p1_correlation_table(_contrast_rows(rev), _plan(cells)), "return", "C_minus_M")["rho"] == \
        pytest.approx(-1.0)


def test_too_few_cells_and_a_constant_predictor_are_na_with_a_reason():
    rows, cells = _hand()
    out = p1_correlation_table(rows, _plan(cells[:4]))
    for r in out:
        assert r["n_cells"] == 4 and r["na_reason"].startswith("4 cell(s)")
        assert all(r[k] is None for k in ("r2", "r", "rho", "slope", "r2_ci_low", "rho_ci_high", "rho_cell_ci_low"))
    assert "4 cell(s)" in markdown_table(out) and "| n/a" in markdown_table(out)
    # M constant: every base cell solves one of two attempts on each task (C 1, pass@1 .5, M .5)
    rates = {}
    for i in range(5):
        rates[("base", f"h{i}")], rates[(f"a{i}", f"h{i}")] = [1, 1], [i % 3, 2 - i % 2]
    out = p1_correlation_table(_contrast_rows(rates), _plan([{"checkpoint": f"a{i}", "harness": f"h{i}"}
                                                             for i in range(5)]))
    m = _row(out, "gain", "M")
    assert m["r2"] is None and m["rho"] is None and m["na_reason"].startswith("predictor constant over the 5 cells")
    assert _row(out, "gain", "C")["na_reason"].startswith("predictor constant")  # C = 1 everywhere too


def test_seeded_deterministic_and_the_seed_moves_only_the_intervals():
    rows, cells = _hand()
    a = p1_correlation_table(rows, _plan(cells))
    assert p1_correlation_table(rows, _plan(cells)) == a
    b = p1_correlation_table(rows, _plan(cells, seed=8))
    assert [r["r2"] for r in a] == [r["r2"] for r in b]
    ivs = [f"{s}{e}" for s in ("r2", "rho", "r2_cell", "rho_cell") for e in ("_ci_low", "_ci_high")]
    assert [[r[k] for k in ivs] for r in a] != [[r[k] for k in ivs] for r in b]
    assert a[0]["seed"] == seed_from(7, "p1_correlations", "p1-gain")
    # the cell interval, recomputed from its documented seed: cells resampled, the quantiles of the R^2 kept
    r = _row(a, "return", "C_minus_M")
    idx = np.random.default_rng(seed_from(r["seed"], "cells")).integers(0, 5, (400, 5))
    x, y = (C - M)[idx], RET[idx]
    keep = (np.ptp(x, axis=1) > 1e-6) & (np.ptp(y, axis=1) > 1e-6)
    r2 = np.array([np.corrcoef(u, v)[0, 1] ** 2 for u, v in zip(x[keep], y[keep])])
    tail = 0.05 / 2 / 2
    assert r["cell_resamples_valid"] == keep.sum()
    assert (r["r2_cell_ci_low"], r["r2_cell_ci_high"]) == pytest.approx(tuple(np.quantile(r2, [tail, 1 - tail])))


def _seeded(seed_rows):
    """5 cells, 3 identical tasks each (task resampling moves nothing); arm i's two seeds
    resolve seed_rows[i] = (s0, s1) attempts of 2 on every task."""
    rates = {}
    for i, (s0, s1) in enumerate(seed_rows):
        rates[("base", f"h{i}")] = [i % 2 + (i > 2)] * 3
        rates[(f"a{i}@s0", f"h{i}")], rates[(f"a{i}@s1", f"h{i}")] = [s0] * 3, [s1] * 3
    cells = [{"checkpoint": f"a{i}", "harness": f"h{i}"} for i in range(5)]
    return _contrast_rows(rates), cells, {f"a{i}": [f"a{i}@s0", f"a{i}@s1"] for i in range(5)}


def test_the_seed_task_interval_resamples_the_training_seeds():
    rows, cells, arms = _seeded([(0, 2), (1, 1), (2, 0), (0, 0), (2, 2)])
    out = p1_correlation_table(rows, _plan(cells, arm_seeds=arms))
    r = _row(out, "return", "C_minus_M")
    # the point: each arm's return is the mean of its seeds [.5, .5, .5, 0, 1]
    pts = p1_cells(rows, cells, 2, members=lambda n: arms.get(n, [n]))
    assert np.allclose(pts["return"], [.5, .5, .5, 0, 1])
    assert r["interval"] == "seed-task" and r["r2"] == pytest.approx(stats.pearsonr(pts["C"] - pts["M"],
                                                                                    pts["return"]).statistic ** 2)
    # the tasks are identical, so only the seed draws can widen the interval
    assert r["r2_ci_high"] - r["r2_ci_low"] > 0.1 and r["rho_ci_high"] - r["rho_ci_low"] > 0.1
    # the same per-arm means from seeds that agree: nothing left to resample, the interval is the point
    rows2, _, _ = _seeded([(1, 1), (1, 1), (1, 1), (0, 0), (2, 2)])
    same = _row(p1_correlation_table(rows2, _plan(cells, arm_seeds=arms)), "return", "C_minus_M")
    assert same["r2"] == pytest.approx(r["r2"]) and same["r2_ci_low"] == pytest.approx(same["r2_ci_high"])


def test_tasks_are_drawn_once_for_every_cell_within_each_suite():
    rng = np.random.default_rng(0)
    rates, cells = {}, []
    for i in range(3):
        rates[("base", f"h{i}")] = list(rng.integers(0, 3, 7))
        for s in (0, 1):
            rates[(f"a{i}@s{s}", f"h{i}")] = list(rng.integers(0, 3, 7))
        cells += [{"checkpoint": f"a{i}", "harness": f"h{i}", "suite": su} for su in ("x", "y")]
    rows = _contrast_rows(rates)
    suite_of = {f"t{j}": "x" if j < 4 else "y" for j in range(7)}
    plan = _plan(cells, arm_seeds={f"a{i}": [f"a{i}@s0", f"a{i}@s1"] for i in range(3)}, suite_of=suite_of)
    d = _Design(rows, cells, 2, plan, "base")
    w, pick = d.draw(np.random.default_rng(1), 300)
    assert d.tasks == [f"t{j}" for j in range(7)]
    assert (w[:, :4].sum(axis=1) == 4).all() and (w[:, 4:].sum(axis=1) == 3).all()  # each suite keeps its size
    assert [p.shape for p in pick] == [(300, 2)] * 3
    # at weight 1 and every seed once, the design gives p1_cells' values
    got = d.metrics(np.ones((1, 7)), None)
    pts = p1_cells(rows, cells, 2, members=lambda n: plan["arm_seeds"].get(n, [n]), suite_of=suite_of)
    for k in ("C", "M", "gain", "return"):
        assert np.allclose(got[k][0], pts[k]), k
    # a resample's cell values are those of the cells on the drawn tasks (task t weighted by its count)
    m = d.metrics(w[:1], [p[:1] for p in pick])
    t_draw = [t for t, c in zip(d.tasks, w[0]) for _ in range(int(c))]
    p0 = pick[0][0]
    redo = _contrast_rows({(f"a0@s{s}", "h0"): [rates[(f"a0@s{s}", "h0")][int(t[1:])] for t in t_draw] for s in (0, 1)}
                          | {("base", "h0"): [rates[("base", "h0")][int(t[1:])] for t in t_draw]})
    sub = {f"t{j}": suite_of[t] for j, t in enumerate(t_draw)}
    want = p1_cells(redo, cells[:2], 2, members=lambda n: [f"a0@s{s}" for s in p0], suite_of=sub)
    for k in ("C", "gain", "return"):
        assert np.allclose(m[k][0, :2], want[k]), k


def test_correlations_match_scipy_row_by_row():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 4, (50, 6)).astype(float), rng.normal(size=(50, 6))
    got = correlations(x, y)
    for i in range(50):
        if np.ptp(x[i]) == 0:
            assert not got["defined"][i] and np.isnan(got["rho"][i])
            continue
        assert got["rho"][i] == pytest.approx(stats.spearmanr(x[i], y[i]).statistic)
        assert got["r2"][i] == pytest.approx(stats.pearsonr(x[i], y[i]).statistic ** 2)


def test_a_plan_without_p1_findings_has_no_table():
    rows, cells = _hand()
    plan = _plan(cells)
    plan["findings"] = [plan["findings"][0] | {"measure": "contrast"}]
    assert p1_correlation_table(rows, plan) == []


def test_the_findings_command_prints_and_writes_the_table_of_a_p1_run(tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.published_findings import P1_CORRELATIONS_FILE
    from tasks.config import RunConfig
    from tasks.evaluate.scripted import ScriptedRunner
    from tasks.evaluate.stage import run_evaluate
    from tests.evaluate.test_findings import _cfg
    from tests.evaluate.test_stage import _store

    data = _cfg().model_dump(mode="json", exclude_none=True)
    data["suites"] = [{"name": "basic_arithmetic", "size": 16, "seed": 2},
                      {"name": "products", "size": 16, "seed": 2, "params": {"min_digits": 2, "max_digits": 2}}]
    hs = ["direct", "react-python", "boxed"]
    data["evaluate"]["harnesses"] = hs
    cells = [{"checkpoint": "final", "harness": h, "suite": f"reasoning_gym/{s}"}
             for h in hs for s in ("basic_arithmetic", "products")]
    data["evaluate"]["findings"] = [
        {"name": f"p1-{t}", "paper": "P1", "headline": "C - M predicts.", "measure": "p1_predictor_gap",
         "claim": "increase", "target": t, "cells": cells} for t in ("gain", "return")]
    cfg = RunConfig.model_validate(data)
    store, refs, _, _ = _store(tmp_path, cfg)
    run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(
        p_resolve={"direct": 0.6, "react-python": 0.2, "boxed": 0.4}, p_checkpoint={"final": 0.5}, seed=3))
    cfg_file = tmp_path / "p1.yaml"
    cfg_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "res" / "findings.jsonl"
    out.parent.mkdir()
    r = CliRunner().invoke(app, ["findings", "-c", str(cfg_file), "--run-dir", str(store.root), "--append", str(out)])
    assert r.exit_code == 0, r.output
    written = [json.loads(x) for x in (out.parent / P1_CORRELATIONS_FILE).read_text().splitlines()]
    want = p1_correlation_table(store.rows(("evaluate", "evaluations")), store.read_json("evaluate/plan.json"))
    assert len(written) == 6 and [{k: w[k] for k in want[0]} for w in written] == want
    published = [json.loads(x) for x in out.read_text().splitlines()]
    assert {w["plan_hash"] for w in written} == {published[0]["plan_hash"]}
    assert {w["run"] for w in written} == {f"{cfg.name}-{cfg.config_hash()[:10]}"}
    assert all(w["n_cells"] == 6 and w["findings"] == "p1-gain, p1-return" for w in written)
    assert markdown_table(want) in r.output and f"appended 6 P1 correlation row(s) to {out.parent}" in r.output
    # the findings rows and their verification are untouched
    assert [p["name"] for p in published] == ["p1-gain", "p1-return"]
    assert CliRunner().invoke(app, ["verify", str(store.root), "--findings", str(out)]).exit_code == 0
