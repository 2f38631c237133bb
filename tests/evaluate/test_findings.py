"""Findings: the verdict rule branch by branch, the spread measure by hand, and a sealed run whose
findings are written, recomputed by `harnessrl verify`, and caught when edited."""

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas import ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.findings import spread_gap, verdict
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.stage import run_evaluate
from tests.evaluate.test_stage import _rewrite, _store


@pytest.mark.parametrize("claim,est,lo,hi,margin,control,want", [
    ("increase", 0.10, 0.02, 0.18, 0.0, None, "reproduced"),
    ("increase", 0.10, 0.02, 0.18, 0.0, 0.03, "reproduced"),       # control moved less
    ("increase", 0.10, 0.02, 0.18, 0.0, 0.12, "inconclusive"),     # control moved as much: not the reward
    ("increase", 0.01, -0.03, 0.04, 0.05, None, "not reproduced"),  # any effect below the smallest of interest
    ("increase", -0.10, -0.18, -0.02, 0.0, None, "not reproduced"),  # the other way
    ("increase", 0.03, -0.03, 0.09, 0.05, None, "inconclusive"),
    ("increase", None, None, None, 0.0, None, "inconclusive"),
    ("no_increase", 0.01, -0.04, 0.04, 0.05, None, "reproduced"),
    ("no_increase", 0.12, 0.07, 0.17, 0.05, None, "not reproduced"),
    ("no_increase", 0.05, -0.01, 0.11, 0.05, None, "inconclusive"),
    ("equivalent", 0.01, -0.04, 0.04, 0.05, None, "reproduced"),
    ("equivalent", -0.01, -0.06, 0.04, 0.05, None, "inconclusive"),  # reaches below -margin
    ("equivalent", -0.12, -0.17, -0.07, 0.05, None, "not reproduced"),  # wholly below -margin
    ("equivalent", 0.12, 0.07, 0.17, 0.05, None, "not reproduced"),
])
def test_the_verdict_rule_branch_by_branch(claim, est, lo, hi, margin, control, want):
    got, reason = verdict(claim, est, lo, hi, margin, control)
    assert got == want, reason
    assert "\n" not in reason and reason


def test_spread_gap_by_hand():
    # 2 checkpoints x 3 harnesses x 2 tasks: P = [[0.5, 0.0, 1.0], [0.5, 0.25, 0.75]]
    r = np.array([[[0.5, 0.5], [0.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.5, 0.0], [0.5, 1.0]]])
    # harness spread: mean(1.0 - 0.0, 0.75 - 0.25) = 0.75; recipe spread: mean(0, 0.25, 0.25) = 1/6
    assert spread_gap(r) == pytest.approx(0.75 - 1 / 6)


def _cfg():
    contrasts = [{"name": "final-minus-base-direct", "a": {"checkpoint": "final", "harness": "direct"},
                  "b": {"checkpoint": "base", "harness": "direct"}},
                 {"name": "final-minus-base-react", "a": {"checkpoint": "final", "harness": "react-python"},
                  "b": {"checkpoint": "base", "harness": "react-python"}}]
    findings = [{"name": "harness-moves-more", "paper": "P4", "measure": "harness_spread_minus_recipe_spread",
                 "claim": "increase", "headline": "The evaluation harness moves pass@1 more than the recipe."},
                {"name": "gain-direct", "paper": "P1", "measure": "contrast", "contrast": "final-minus-base-direct",
                 "control": "final-minus-base-react", "claim": "increase", "headline": "Training helps."}]
    return RunConfig.model_validate({
        "name": "found", "seed": 3, "suites": [{"name": "basic_arithmetic", "size": 40, "seed": 2}],
        "split": {"test_fraction": 0.5, "disjoint": True}, "harnesses": ["direct"],
        "evaluate": {"attempts": 2, "harnesses": ["direct", "react-python"], "bootstrap_resamples": 300,
                     "contrasts": contrasts, "findings": findings}, "analyze": {"ceiling_k": 2}})


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("found")
    cfg = _cfg()
    store, refs, *_ = _store(tmp, cfg)
    # direct solves 0.7 of attempts, react-python 0.1, whatever the checkpoint: the harness moves
    # pass@1 by about 0.6, the checkpoint by chance alone
    out = run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(p_resolve={"direct": 0.7, "react-python": 0.1},
                                                                       seed=5))
    return store, out


def test_findings_are_written_sealed_with_the_plan_and_decided_by_the_rule(found):
    store, out = found
    rows = {r["name"]: r for r in store.rows(out["eval_findings"])}
    plan = store.read_json("evaluate/plan.json")
    assert [f["name"] for f in plan["findings"]] == ["harness-moves-more", "gain-direct"]
    from tasks.evaluate.prereg import differences, preregistration

    pre = preregistration(_cfg())
    assert pre["findings"] == plan["findings"] and differences(pre, plan) == []
    assert differences({**pre, "findings": pre["findings"][:1]}, plan)  # a finding added after freeze shows
    spread = rows["harness-moves-more"]
    assert spread["n"] == 20 and 0.4 < spread["estimate"] < 0.8
    assert spread["ci_low"] > 0 and spread["verdict"] == "reproduced"
    assert spread["level"] == pytest.approx(1 - 0.05 / 2)  # Bonferroni over the two findings
    gain = rows["gain-direct"]
    c = {r["name"]: r for r in store.rows(out["eval_contrasts"])}
    assert (gain["estimate"], gain["ci_low"], gain["ci_high"]) == (
        c["final-minus-base-direct"]["estimate"], c["final-minus-base-direct"]["ci_low"],
        c["final-minus-base-direct"]["ci_high"])
    assert gain["control_estimate"] == c["final-minus-base-react"]["estimate"]
    # no real difference between checkpoints: the gain's interval holds 0
    assert gain["ci_low"] <= 0 <= gain["ci_high"] and gain["verdict"] == "inconclusive"


def test_verify_recomputes_the_findings_and_names_an_edited_verdict(found, tmp_path):
    store, _ = found
    rd = tmp_path / "copy"
    shutil.copytree(store.root, rd)
    cli = CliRunner()
    assert cli.invoke(app, ["verify", str(rd)]).exit_code == 0
    _rewrite(rd / "evaluate/eval_findings.parquet", lambda r: r[1].update(verdict="reproduced"))
    bad = cli.invoke(app, ["verify", str(rd)])
    assert bad.exit_code == 1 and "eval_findings.parquet row 1: verdict='reproduced'" in bad.output.replace("\n", " ")


def test_a_finding_naming_an_unknown_contrast_is_refused_at_load():
    data = _cfg().model_dump(mode="json")
    data["evaluate"]["findings"][1]["contrast"] = "nope"
    with pytest.raises(ValueError, match=r"findings\['gain-direct'\]\.contrast='nope' is not one of"):
        RunConfig.model_validate(data)


def test_published_rows_copy_the_verified_findings_and_verify_catches_an_edited_row(found, tmp_path):
    import json

    from flows.published_findings import check_published, finding_rows
    from tasks.evaluate.seal import SealError

    store, _ = found
    rows = finding_rows(store, config="configs/p4-findings.yaml", config_hash="ab" * 32, commit="c0ffee")
    assert [r["name"] for r in rows] == ["harness-moves-more", "gain-direct"]
    need = {"paper", "headline", "measure", "estimate", "ci_low", "ci_high", "n", "verdict", "control", "config",
            "config_hash", "commit", "key_fingerprint", "plan_hash", "wall_s"}
    assert need <= set(rows[0]) and rows[0]["key_fingerprint"] and rows[1]["control"] is not None
    # no infra error in this run; its folder has a rollout (1 episode) and an evaluation, no train_steps
    assert rows[0]["infra_errors"] == {"rollout": 0, "evaluate": 0} and rows[0]["infra_total"] == 0
    assert rows[0]["infra_planned"] == {"rollout": 1, "evaluate": 20 * 2 * 2 * 2} and rows[0]["infra_threshold"] == 0.0
    f = tmp_path / "findings.jsonl"
    old = {k: v for k, v in rows[0].items() if not k.startswith("infra_")}  # a row published before the infra fields
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps({**rows[0], "config_hash": "ff"}) + "\n"
                 + json.dumps(old) + "\n")
    assert check_published(store, f, "abab") == (3, 0)  # the other config's row is not this run's business
    # the same config run again elsewhere (same folder name): its rows name another plan, or, older
    # than plan_hash, another signing key; they are counted, not compared
    plan, key = rows[0]["plan_hash"], rows[0]["key_fingerprint"]
    assert len(plan) == 64
    other_plan = {**rows[1], "plan_hash": "0" * 64, "estimate": 0.99}
    other_key = {k: v for k, v in {**rows[1], "key_fingerprint": "SHA256:other", "estimate": 0.99}.items()
                 if k != "plan_hash"}
    same_key = {k: v for k, v in rows[1].items() if k != "plan_hash"}
    f.write_text("".join(json.dumps(r) + "\n" for r in [*rows, other_plan, other_key, same_key]))
    assert check_published(store, f, "abab", plan_hash=plan, fingerprint=key) == (3, 2)
    with pytest.raises(SealError, match=r"findings.jsonl:3: estimate="):  # without the plan: every row compared
        check_published(store, f, "abab")
    rows[1]["ci_low"] = rows[1]["ci_low"] + 0.01
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SealError, match=r"findings.jsonl:2: ci_low="):
        check_published(store, f, "abab", plan_hash=plan, fingerprint=key)


def test_predictor_gap_by_hand():
    from tasks.evaluate.findings import predictor_gap

    c = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
    m = np.array([0.1, 0.3, 0.2, 0.5, 0.4])
    y = (c - m) * 2 + 0.1  # the target is C - M exactly: R^2 = 1 for it
    r2 = lambda x: float(np.corrcoef(x, y)[0, 1] ** 2)  # noqa: E731
    assert predictor_gap(c, m, y) == pytest.approx(1.0 - max(r2(c), r2(m)))
    assert predictor_gap(c, m, c * 3) == pytest.approx(float(np.corrcoef(c - m, c)[0, 1] ** 2) - 1.0)  # C is best
    assert np.isnan(predictor_gap(np.ones(5), m, y))  # a constant predictor: undefined, not a number


def test_p1_cells_by_hand():
    from tasks.evaluate.findings import p1_cells
    from tests.evaluate.test_stats import _contrast_rows

    # 4 tasks x 2 attempts; base under h1 resolves [1, 0, 2, 0] -> pass@1 0.375, pass@2 = (1 + 0 + 1 + 0) / 4
    rows = _contrast_rows({("base", "h1"): [1, 0, 2, 0], ("a1", "h1"): [2, 1, 2, 1]})
    pts = p1_cells(rows, [{"checkpoint": "a1", "harness": "h1"}], 2)
    assert pts["C"][0] == pytest.approx(0.5) and pts["M"][0] == pytest.approx(0.5 - 0.375)
    assert pts["gain"][0] == pytest.approx(0.75 - 0.375) and pts["return"][0] == pytest.approx(0.75)


def test_a_p1_cell_of_one_suite_counts_only_that_suites_tasks():
    from tasks.evaluate.findings import p1_cells
    from tests.evaluate.test_stats import _contrast_rows

    # 4 tasks x 2 attempts; suite x = t0, t2 (base [1, 2] of 2, a1 [2, 2]); suite y = t1, t3 (base [0, 0], a1 [1, 1])
    rows = _contrast_rows({("base", "h1"): [1, 0, 2, 0], ("a1", "h1"): [2, 1, 2, 1]})
    suite_of = {"t0": "x", "t1": "y", "t2": "x", "t3": "y"}
    cells = [{"checkpoint": "a1", "harness": "h1", "suite": "x"}, {"checkpoint": "a1", "harness": "h1", "suite": "y"},
             {"checkpoint": "a1", "harness": "h1"}]
    pts = p1_cells(rows, cells, 2, suite_of=suite_of)
    # x: base pass@1 (0.5 + 1) / 2 = 0.75, pass@2 1; a1 1 -> C 1, M 0.25, gain 0.25
    assert pts["C"][0] == pytest.approx(1.0) and pts["M"][0] == pytest.approx(0.25)
    assert pts["gain"][0] == pytest.approx(0.25) and pts["return"][0] == pytest.approx(1.0)
    # y: base 0, pass@2 0; a1 0.5 -> C 0, M 0, gain 0.5
    assert pts["C"][1] == pytest.approx(0.0) and pts["M"][1] == pytest.approx(0.0)
    assert pts["gain"][1] == pytest.approx(0.5)
    # no suite: every task, as before
    assert pts["C"][2] == pytest.approx(0.5) and pts["gain"][2] == pytest.approx(0.375)
    with pytest.raises(ValueError, match="suite 'x'"):
        p1_cells(rows, cells[:1], 2)  # a suite cell with no sealed suites is refused, not read as every task


def test_p1_cells_naming_a_suite_are_checked_at_load_and_keep_old_hashes():
    from tasks.config.evaluate import P1Cell

    assert "suite" not in P1Cell.model_validate({"checkpoint": "a", "harness": "h"}).model_dump(mode="json")
    cfg = _cfg().model_dump(mode="json", exclude_none=True)
    cell = {"checkpoint": "final", "harness": "direct"}
    cfg["evaluate"]["findings"] = [{"name": "p1", "paper": "P1", "headline": "h", "measure": "p1_predictor_gap",
                                    "claim": "increase", "cells": [dict(cell, suite="reasoning_gym/products")] * 3}]
    with pytest.raises(ValueError, match=r"cells\[0\]\.suite='reasoning_gym/products' is not a suite"):
        RunConfig.model_validate(cfg)
    cfg["evaluate"]["findings"][0]["cells"] = [dict(cell, suite="reasoning_gym/basic_arithmetic")] * 3
    assert RunConfig.model_validate(cfg).evaluate.findings[0].cells[0].suite == "reasoning_gym/basic_arithmetic"


def test_a_p1_finding_over_five_cells_is_computed_and_recomputed():
    from tasks.evaluate.findings import finding_table
    from tests.evaluate.test_stats import _contrast_rows

    rates = {}
    base = [[0, 1, 0, 0, 2, 0], [1, 1, 2, 0, 0, 1], [2, 2, 1, 0, 1, 2], [0, 0, 0, 1, 0, 0], [1, 2, 2, 2, 1, 1]]
    for i, b in enumerate(base):
        rates[("base", f"h{i}")] = b
        rates[(f"arm{i}", f"h{i}")] = [min(2, x + (i % 3)) for x in b]
    rows = _contrast_rows(rates)
    plan = {"seed": 7, "alpha": 0.05, "attempts": 2, "bootstrap_resamples": 400, "checkpoints": [], "harnesses": [],
            "findings": [{"name": "p1", "paper": "P1", "headline": "C - M predicts the gain best",
                          "measure": "p1_predictor_gap", "claim": "increase", "margin": 0.0, "target": "gain",
                          "cells": [{"checkpoint": f"arm{i}", "harness": f"h{i}"} for i in range(5)]}]}
    from tasks.evaluate.findings import p1_cells, predictor_gap

    (row,) = finding_table(rows, plan, [])
    pts = p1_cells(rows, plan["findings"][0]["cells"], 2)
    assert row["n"] == 5 and row["estimate"] == pytest.approx(predictor_gap(pts["C"], pts["M"], pts["gain"]))
    assert row["level"] == pytest.approx(0.95)
    assert row["ci_low"] is None or row["ci_low"] <= row["estimate"] <= row["ci_high"]
    assert finding_table(rows, plan, []) == [row]  # seeded: the same numbers again (what verify relies on)


def test_the_findings_command_publishes_a_verified_run_and_verify_rechecks_the_file(found, tmp_path):
    import json

    import yaml

    store, _ = found
    cfg_file = tmp_path / "found.yaml"
    cfg_file.write_text(yaml.safe_dump(_cfg().model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "findings.jsonl"
    cli = CliRunner()
    r = cli.invoke(app, ["findings", "-c", str(cfg_file), "--run-dir", str(store.root), "--append", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["name"] for x in rows] == ["harness-moves-more", "gain-direct"]
    assert rows[0]["config"] == str(cfg_file) and rows[0]["config_hash"] == _cfg().config_hash()
    # another config than the run's: refused, nothing appended
    other = tmp_path / "other.yaml"
    other.write_text(cfg_file.read_text().replace("attempts: 2", "attempts: 3"))
    bad = cli.invoke(app, ["findings", "-c", str(other), "--run-dir", str(store.root), "--append", str(out)])
    assert bad.exit_code == 2 and "NOT THIS RUN" in bad.output and len(out.read_text().splitlines()) == 2


def _pooled_plan(a_cells, b_cells, suite=None, n=6):
    f = {"name": "pooled", "paper": "P5", "headline": "unbiased arms end better", "measure": "pooled_contrast",
         "claim": "increase", "margin": 0.0, "a_cells": a_cells, "b_cells": b_cells}
    if suite:
        f["suite"] = suite
    return {"seed": 5, "alpha": 0.05, "attempts": 2, "bootstrap_resamples": 400, "checkpoints": [], "harnesses": [],
            "suite_of": {f"t{i}": ("in" if i < n // 2 else "out") for i in range(n)}, "findings": [f]}


def test_a_pooled_finding_is_the_mean_of_a_cells_minus_the_mean_of_b_cells_by_hand():
    from tasks.evaluate.findings import finding_table
    from tests.evaluate.test_stats import _contrast_rows

    # 6 tasks, 2 attempts: rates k1 = [1, 1, .5, 1, 0, .5], both = [1, .5, .5, 1, .5, .5],
    # k3 = [0, .5, .5, 0, 0, .5], k2 = [.5, .5, 0, 0, .5, 0]
    rows = _contrast_rows({("k1", "h"): [2, 2, 1, 2, 0, 1], ("both", "h"): [2, 1, 1, 2, 1, 1],
                           ("k3", "h"): [0, 1, 1, 0, 0, 1], ("k2", "h"): [1, 1, 0, 0, 1, 0]})
    a = [{"checkpoint": "k1", "harness": "h"}, {"checkpoint": "both", "harness": "h"}]
    b = [{"checkpoint": "k3", "harness": "h"}, {"checkpoint": "k2", "harness": "h"}]
    # per task (a mean - b mean): [1-.25, .75-.5, .5-.25, 1-0, .25-.25, .5-.25] = [.75, .25, .25, 1, 0, .25]
    (row,) = finding_table(rows, _pooled_plan(a, b), [])
    assert row["n"] == 6 and row["estimate"] == pytest.approx(2.5 / 6)
    assert row["ci_low"] <= row["estimate"] <= row["ci_high"] and row["level"] == pytest.approx(0.95)
    assert row["verdict"] == "reproduced"  # every per-task difference is >= 0 and most are > 0
    (flip,) = finding_table(rows, _pooled_plan(b, a), [])  # the sides swapped: the sign flips
    assert flip["estimate"] == pytest.approx(-2.5 / 6) and flip["verdict"] == "not reproduced"
    # one suite only: tasks t3..t5 ("out"): [1, 0, .25] -> 1.25 / 3
    (out,) = finding_table(rows, _pooled_plan(a, b, suite="out"), [])
    assert out["n"] == 3 and out["estimate"] == pytest.approx(1.25 / 3)
    assert finding_table(rows, _pooled_plan(a, b), []) == [row]  # seeded


def test_a_contrast_of_one_suite_counts_only_that_suites_tasks():
    from tasks.evaluate.stats import cell_table, contrast_table
    from tests.evaluate.test_stats import _contrast_rows, _plan

    # final - base per task: [1, .5, 0, 1]; suite "x" = tasks t0, t2 -> mean 0.5; all four -> 0.625
    rows = _contrast_rows({("final", "h"): [2, 2, 1, 2], ("base", "h"): [0, 1, 1, 0]})
    both = {"a": {"checkpoint": "final", "harness": "h"}, "b": {"checkpoint": "base", "harness": "h"}}
    plan = _plan(4, ["h"], [{"name": "all", **both}, {"name": "only-x", "suite": "x", **both}])
    plan["suite_of"] = {"t0": "x", "t1": "y", "t2": "x", "t3": "y"}
    every, only = contrast_table(rows, plan, cell_table(rows, plan, 0.95), alpha=0.05, resamples=300, power=0.8)
    assert every["n_tasks"] == 4 and every["estimate"] == pytest.approx(0.625)
    assert only["n_tasks"] == 2 and only["estimate"] == pytest.approx(0.5)


def test_later_options_left_unset_keep_a_configs_hash_and_bad_ones_are_refused():
    from tasks.config.evaluate import ContrastConfig, FindingConfig

    c = ContrastConfig.model_validate({"name": "c", "a": {"checkpoint": "final", "harness": "direct"},
                                       "b": {"checkpoint": "base", "harness": "direct"}})
    assert "suite" not in c.model_dump(mode="json")  # unset: the plan, pre-registration and config hash unchanged
    assert c.model_copy(update={"suite": "s"}).model_dump(mode="json")["suite"] == "s"
    f = {"name": "f", "paper": "P5", "headline": "h", "measure": "contrast", "contrast": "c", "claim": "increase"}
    assert not {"a_cells", "b_cells", "suite"} & set(FindingConfig.model_validate(f).model_dump(mode="json"))
    cell = [{"checkpoint": "final", "harness": "direct"}]
    with pytest.raises(ValueError, match="pooled_contrast"):
        FindingConfig.model_validate({**f, "measure": "pooled_contrast", "contrast": None})
    with pytest.raises(ValueError, match="disjoint"):
        FindingConfig.model_validate({**f, "measure": "pooled_contrast", "contrast": None, "a_cells": cell,
                                      "b_cells": cell})
    with pytest.raises(ValueError, match="margin"):
        FindingConfig.model_validate({**f, "claim": "equivalent"})
    cfg = _cfg().model_dump(mode="json", exclude_none=True)
    cfg["evaluate"]["contrasts"][0]["suite"] = "reasoning_gym/gsm_symbolic"
    with pytest.raises(ValueError, match="suite='reasoning_gym/gsm_symbolic' is not a suite of this run"):
        RunConfig.model_validate(cfg)
    cfg["evaluate"]["contrasts"][0]["suite"] = "reasoning_gym/basic_arithmetic"
    assert RunConfig.model_validate(cfg).evaluate.contrasts[0].suite == "reasoning_gym/basic_arithmetic"


def _infra_cfg(fraction=None):
    data = _cfg().model_dump(mode="json", exclude_none=True)
    if fraction is not None:
        data["evaluate"]["max_infra_error_fraction"] = fraction
    return RunConfig.model_validate(data)


def _infra_run(tmp, cfg):
    store, refs, *_ = _store(tmp, cfg)
    run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(p_resolve={"direct": 0.7, "react-python": 0.1},
                                                                 infra_rate=0.1, seed=5))
    return store


def _final_infra(store):
    """The evaluation's planned attempts and those still infra_error, counted here from the sealed rows."""
    last = {}
    for r in store.rows(("evaluate", "evaluations")):
        key = (r["checkpoint"], r["harness_name"], r["record_id"], r["attempt"])
        if key not in last or r["retry"] > last[key]["retry"]:
            last[key] = r
    return len(last), sum(r["status"] == "infra_error" for r in last.values())


def test_a_run_with_infra_errors_above_the_threshold_is_not_published(tmp_path):
    import json

    import yaml

    from flows.published_findings import finding_rows
    from tasks.analysis.infra import InfraThresholdError

    cfg = _infra_cfg()  # the threshold unset: the default 0
    assert "max_infra_error_fraction" not in cfg.model_dump(mode="json")["evaluate"]  # config hash as before
    assert cfg.config_hash() == _cfg().config_hash()
    store = _infra_run(tmp_path, cfg)
    planned, lost = _final_infra(store)
    assert planned == 20 * 2 * 2 * 2 and lost > 0  # test tasks x harnesses x checkpoints x attempts
    with pytest.raises(InfraThresholdError, match=rf"^evaluate: {lost} infra error\(s\) of {planned} planned attempts, "
                                                  r"above the findings threshold of 0 "):
        finding_rows(store, config="c.yaml", config_hash="ab" * 32, commit="c0ffee")
    cfg_file = tmp_path / "infra.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "findings.jsonl"
    r = CliRunner().invoke(app, ["findings", "-c", str(cfg_file), "--run-dir", str(store.root), "--append", str(out)])
    assert r.exit_code == 1, r.output
    err = [x for x in r.output.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("NOT PUBLISHED: ") and f"evaluate: {lost} infra error(s)" in err[0]
    assert "threshold of 0" in err[0] and not out.exists()  # nothing appended
    # the threshold in the rules, sealed with the plan: a run within it is published with its counts
    cfg2 = _infra_cfg(0.5)
    store2 = _infra_run(tmp_path / "lenient", cfg2)
    plan = store2.read_json("evaluate/plan.json")
    from tasks.evaluate.prereg import preregistration

    assert plan["max_infra_error_fraction"] == 0.5 == preregistration(cfg2)["max_infra_error_fraction"]
    assert "max_infra_error_fraction" not in store.read_json("evaluate/plan.json")
    rows = finding_rows(store2, config="c.yaml", config_hash="cd" * 32, commit="c0ffee")
    planned2, lost2 = _final_infra(store2)
    assert {k: rows[0][k] for k in ("infra_errors", "infra_planned", "infra_total", "infra_threshold")} == {
        "infra_errors": {"rollout": 0, "evaluate": lost2}, "infra_planned": {"rollout": 1, "evaluate": planned2},
        "infra_total": lost2, "infra_threshold": 0.5}
    # harnessrl verify --findings recomputes a row's infra counts: an edited count is caught
    from flows.published_findings import check_published
    from tasks.evaluate.seal import SealError

    f = tmp_path / "published.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert check_published(store2, f, "cdcd") == (2, 0)
    rows[1]["infra_errors"] = {"rollout": 0, "evaluate": lost2 - 1}
    f.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with pytest.raises(SealError, match=r"published.jsonl:2: infra_errors="):
        check_published(store2, f, "cdcd")


def test_a_bad_infra_threshold_is_refused_at_load():
    data = _cfg().model_dump(mode="json", exclude_none=True)
    data["evaluate"]["max_infra_error_fraction"] = 1.5
    with pytest.raises(ValueError, match="max_infra_error_fraction"):
        RunConfig.model_validate(data)


def test_a_p1_finding_over_suite_cells_is_sealed_computed_and_verified(tmp_path):
    """Two task families, a P1 finding whose cells name them: the plan seals each test task's suite,
    the finding's points are the (harness, suite) cells, and verify recomputes the row."""
    import math

    from tasks.evaluate.findings import p1_cells, predictor_gap

    data = _cfg().model_dump(mode="json", exclude_none=True)
    data["suites"] = [{"name": "basic_arithmetic", "size": 20, "seed": 2},
                      {"name": "products", "size": 20, "seed": 2, "params": {"min_digits": 2, "max_digits": 2}}]
    cells = [{"checkpoint": "final", "harness": h, "suite": f"reasoning_gym/{s}"}
             for h in ("direct", "react-python") for s in ("basic_arithmetic", "products")]
    data["evaluate"]["findings"] = [{"name": "p1-cells", "paper": "P1", "headline": "C - M predicts the gain.",
                                     "measure": "p1_predictor_gap", "claim": "increase", "cells": cells}]
    cfg = RunConfig.model_validate(data)
    store, refs, tasks, _ = _store(tmp_path, cfg)
    out = run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(p_resolve={"direct": 0.6, "react-python": 0.2},
                                                                       seed=3))
    plan = store.read_json("evaluate/plan.json")
    test = {t["task_id"]: t["suite"] for t in tasks if t["split"] == "test"}
    assert plan["suite_of"] == test and set(test.values()) == {c["suite"] for c in cells}
    assert plan["findings"][0]["cells"] == cells
    (row,) = store.rows(out["eval_findings"])
    pts = p1_cells(store.rows(("evaluate", "evaluations")), cells, 2, suite_of=plan["suite_of"])
    assert row["n"] == 4 and not np.isnan(pts["C"]).any()
    want = predictor_gap(pts["C"], pts["M"], pts["gain"])
    assert (row["estimate"] is None) if math.isnan(want) else row["estimate"] == pytest.approx(want)
    assert CliRunner().invoke(app, ["verify", str(store.root)]).exit_code == 0
