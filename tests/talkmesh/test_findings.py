"""P3 as a pre-registered finding: per-problem vote matrices, the accuracy-vs-outputs table with
intervals, the mesh-vs-majority@k finding and its verdict, the (unsealed) findings rows, and the
findings config."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import ArtifactStore
from tasks.talkmesh.baselines import vote_curves, vote_matrix
from tasks.talkmesh.config import MeshFinding, load_talkmesh_config
from tasks.talkmesh.findings import bootstrap_mean, budget_rows, equal_budget_rows, finding_table, published_rows
from tasks.talkmesh.talk import HINT_SYSTEM


def test_vote_matrix_by_hand():
    # problem 0: right "1"; problem 1: right "4"
    answers = [["1", "2", "1"], ["3", "3", "4"]]
    conf = [[0.1, 0.9, 0.1], [0.1, 0.2, 0.9]]
    ok = [{"1": True, "2": False}, {"3": False, "4": True}]
    m = vote_matrix(answers, conf, ok, k_max=3)
    # majority: p0 "1" | tie 1/2 -> first "1" | "1" 2:1 ; p1 "3" at every k
    assert m["majority"].tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # weighted: p0 "1" (0.1) | "2" 0.9 > 0.1 | "2" 0.9 > 0.2 ; p1 "3" | "3" 0.3 | "4" 0.9 > 0.3
    assert m["confidence_weighted"].tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_vote_matrix_columns_are_the_curves():
    rng = np.random.default_rng(0)
    answers = [[str(int(x)) for x in rng.integers(0, 3, 6)] for _ in range(5)]
    conf = [list(rng.random(6)) for _ in range(5)]
    ok = [{a: a == "1" for a in row} for row in answers]
    m = vote_matrix(answers, conf, ok, k_max=6, resamples=7, seed=11)
    for r in vote_curves(answers, conf, ok, k_max=6, resamples=7, seed=11):
        assert r["accuracy"] == pytest.approx(m[r["method"]][:, r["k"] - 1].mean(), abs=1e-12)
    # fractions of 7 orderings
    assert np.allclose(m["majority"] * 7, np.round(m["majority"] * 7))


def test_bootstrap_mean_by_hand():
    assert bootstrap_mean([0.5, 0.5, 0.5], 200, 0) == (0.5, 0.5, 0.5)
    # resampled means of [0, 1] are 0, 0.5 or 1: a 99.9% interval spans [0, 1]
    est, lo, hi = bootstrap_mean([0.0, 1.0], 5000, 1, level=0.999)
    assert (est, lo, hi) == (0.5, 0.0, 1.0)
    est, lo, hi = bootstrap_mean([1, 0, 1, 1], 2000, 2)
    assert est == 0.75 and 0.0 <= lo < 0.75 < hi == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_mean([], 10, 0)


def test_budget_rows_by_hand():
    votes = {"majority": np.array([[1.0, 1.0], [0.0, 1.0]])}
    meshes = {"mesh-talk": {"agents": 3, "per_problem": [1.0, 0.5], "outputs_spent": 4.5}}
    rows = budget_rows(votes, meshes, resamples=500, seed=3)
    assert [(r["series"], r["kind"], r["k"], r["agents"]) for r in rows] == [
        ("majority", "vote", 1, None), ("majority", "vote", 2, None), ("mesh-talk", "mesh", None, 3)]
    assert [r["accuracy"] for r in rows] == [0.5, 1.0, 0.75]
    assert [r["outputs_spent"] for r in rows] == [1.0, 2.0, 4.5]
    assert (rows[1]["ci_low"], rows[1]["ci_high"]) == (1.0, 1.0)  # every problem right: no spread
    assert rows[2]["ci_low"] >= 0.5 and rows[2]["ci_high"] <= 1.0 and rows[2]["problems"] == 2
    with pytest.raises(ValueError, match="same non-zero number of problems"):
        budget_rows(votes, {"m": {"agents": 3, "per_problem": [1.0], "outputs_spent": 3.0}}, resamples=10, seed=0)


def test_equal_budget_rows_pick_k_from_the_outputs_spent():
    # majority@k right on problem 0 only at k = 2, on both problems only at k = 4
    maj = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    meshes = {"a": {"agents": 3, "per_problem": [1.0, 0.5], "outputs_spent": 2.4},   # k = 2
              "b": {"agents": 5, "per_problem": [0.0, 0.0], "outputs_spent": 3.5},   # k = 4 (half up)
              "c": {"agents": 8, "per_problem": [1.0, 1.0], "outputs_spent": 11.0},  # k = 4 (clipped to K)
              "d": {"agents": 2, "per_problem": [0.0, 1.0], "outputs_spent": 0.2}}   # k = 1 (clipped to 1)
    rows = {r["condition"]: r for r in equal_budget_rows(meshes, maj, resamples=300, seed=0)}
    assert [rows[c]["k"] for c in "abcd"] == [2, 4, 4, 1]
    assert [rows[c]["majority_accuracy"] for c in "abcd"] == [0.5, 1.0, 1.0, 0.0]
    assert [rows[c]["difference"] for c in "abcd"] == [0.25, -1.0, 0.0, 0.5]
    assert (rows["c"]["ci_low"], rows["c"]["ci_high"]) == (0.0, 0.0) and rows["a"]["problems"] == 2
    with pytest.raises(ValueError, match="has 1 problems"):
        equal_budget_rows({"x": {"agents": 3, "per_problem": [1.0], "outputs_spent": 3.0}}, maj, resamples=10, seed=0)


def _rule(name, agents, k, claim="equivalent", margin=0.1):
    return MeshFinding(name=name, headline=f"{name} headline", agents=agents, k=k, claim=claim, margin=margin)


def test_finding_table_by_hand():
    maj = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])  # majority@2 = [1, 1, 0, 1]
    meshes = {3: ("mesh-talk", [1.0, 1.0, 0.0, 1.0]), 5: ("mesh-talk-n5", [0.0, 0.0, 0.0, 0.0])}
    rows = finding_table([_rule("same", 3, 2), _rule("worse", 5, 2), _rule("vs-k1", 3, 1, "increase", 0.0)],
                         meshes, maj, alpha=0.06, resamples=300, seed=5)
    same, worse, vs1 = rows
    assert all(r["level"] == pytest.approx(1 - 0.06 / 3) for r in rows)  # Bonferroni over 3 findings
    # identical per-problem accuracies: estimate 0 and a zero-width interval, inside +/-0.1
    assert (same["estimate"], same["ci_low"], same["ci_high"], same["n"]) == (0.0, 0.0, 0.0, 4)
    assert same["verdict"] == "reproduced" and same["condition"] == "mesh-talk"
    assert (same["mesh_accuracy"], same["majority_accuracy"]) == (0.75, 0.75)
    # mesh 0/4 against majority 3/4: d = [-1, -1, 0, -1], mean -0.75, every resample <= -1/4 < -0.1
    assert worse["estimate"] == -0.75 and worse["ci_high"] <= -0.25 and worse["verdict"] == "not reproduced"
    # against majority@1 = [0, 0, 0, 1]: d = [1, 1, 0, 0], the interval reaches 0 -> inconclusive
    assert vs1["estimate"] == 0.5 and vs1["ci_low"] == 0.0 and vs1["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="no evaluated mesh of 8 agents"):
        finding_table([_rule("x", 8, 2)], meshes, maj, alpha=0.05, resamples=100, seed=0)
    with pytest.raises(ValueError, match="k=3 is outside"):
        finding_table([_rule("x", 3, 3)], meshes, maj, alpha=0.05, resamples=100, seed=0)


def test_findings_config_loads_and_is_preregistered():
    cfg = load_talkmesh_config("configs/talkmesh-findings.yaml")
    tm = cfg.talkmesh
    assert cfg.split.disjoint and cfg.suites[0].reward == "exact" and cfg.suites[0].name == "chain_sum"
    assert tm.agents == 3 and tm.sizes() == [3, 5, 8] and tm.train_talk and tm.distinct_problems
    assert tm.samples == 32 and (tm.mesh_repeats or 1) * 8 <= tm.samples
    head = tm.findings.rules[0]
    assert (head.agents, head.k, head.claim) == (3, 32, "equivalent") and head.margin > 0
    assert {r.agents for r in tm.findings.rules} == {3, 5, 8}
    quick = load_talkmesh_config("configs/talkmesh-findings.yaml", quick=True)
    assert quick.talkmesh.test_problems < tm.test_problems and quick.talkmesh.findings == tm.findings
    assert quick.config_hash() != cfg.config_hash()


def test_findings_config_has_enough_distinct_problems():
    """The disjoint split of the findings suite holds test_problems / train_problems distinct problems."""
    from tasks.records.overlap import disjoint_split, problem_key
    from tasks.records.suites.base import load_suite

    for quick in (False, True):
        cfg = load_talkmesh_config("configs/talkmesh-findings.yaml", quick=quick)
        rows = [t.to_row("") for t in {t.task_hash: t for t in load_suite(cfg.suites[0])}.values()]
        side = disjoint_split(rows, cfg.split.test_fraction)
        distinct = {s: len({problem_key(r) for r in rows if side[r["task_hash"]] == s}) for s in ("train", "test")}
        assert distinct["test"] >= cfg.talkmesh.test_problems and distinct["train"] >= cfg.talkmesh.train_problems


def test_older_talkmesh_configs_keep_their_dumps():
    cfg = load_talkmesh_config("configs/talkmesh-arith.yaml")
    dump = cfg.talkmesh.model_dump(mode="json")
    assert not {"distinct_problems", "mesh_sizes", "mesh_repeats", "findings"} & set(dump)


def test_findings_options_are_checked(tiny_model_dir):
    from tests.talkmesh.test_run_e2e import _cfg

    with pytest.raises(ValueError, match="talkmesh.mesh_repeats=2: 2 repeats of the largest mesh"):
        _cfg(tiny_model_dir, mesh_repeats=2)  # 2 x 4 agents > 6 samples
    with pytest.raises(ValueError, match=r"talkmesh.mesh_sizes=\[4\]"):
        _cfg(tiny_model_dir, mesh_sizes=[4])
    rule = {"name": "f", "headline": "h", "agents": 5, "k": 6, "claim": "equivalent", "margin": 0.1}
    with pytest.raises(ValueError, match=r"rules\['f'\].agents=5 is not an evaluated mesh size \[4\]"):
        _cfg(tiny_model_dir, findings={"rules": [rule]})
    with pytest.raises(ValueError, match="needs a margin > 0"):
        _cfg(tiny_model_dir, findings={"rules": [{**rule, "agents": 4, "margin": 0.0}]})


class FirstFourRight:
    """Proposal sample j of a problem is right iff j < 4 (counted per prompt); hints and revisions
    as :class:`tests.talkmesh.test_run_e2e.ScriptedPolicy` (a revision adopts the hint's answer)."""

    policy_id = "first-four"

    def __init__(self, tokenizer):
        from tests.talkmesh.test_run_e2e import ScriptedPolicy

        self.tokenizer = tokenizer
        self.talk = ScriptedPolicy(tokenizer)
        self.seen: dict[str, int] = {}

    def generate(self, prompts, sampling, seed):
        import re

        from tasks.rollout.generation import Generation

        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            m = re.search(r"Calculate (.+?)\.", text)
            if HINT_SYSTEM[:30] in text or "A hint from another student" in text:
                out += self.talk.generate([p], sampling, seed)
                continue
            j = self.seen.get(text, 0)
            self.seen[text] = j + 1
            value = eval(m.group(1), {"__builtins__": {}})  # test-made
            reply = f"Answer: {int(value)}" if j < 4 else "Answer: 987654"
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.1] * len(ids), "stop", reply))
        return out


@pytest.fixture(scope="module")
def tiny_findings(tiny_model_dir, tmp_path_factory):
    """A tiny findings run with :class:`FirstFourRight` agents: ``(cfg, run folder, refs)``."""
    from transformers import AutoTokenizer

    from tasks.records.stage import run_freeze
    from tasks.talkmesh.run import run_talkmesh
    from tests.talkmesh.test_run_e2e import _cfg

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rules = [{"name": "mesh4-vs-maj8", "headline": "h", "agents": 4, "k": 8, "claim": "equivalent", "margin": 0.4},
             {"name": "mesh2-vs-maj1", "headline": "h2", "agents": 2, "k": 1, "claim": "increase"}]
    cfg = _cfg(tiny_model_dir, train_talk=False, test_problems=3, samples=8, train_samples=6, mesh_sizes=[2],
               mesh_repeats=2, colluders=[], distinct_problems=True,
               findings={"alpha": 0.1, "bootstrap_resamples": 200, "rules": rules})
    rd = tmp_path_factory.mktemp("tiny-findings-run")
    store = ArtifactStore(rd)
    refs = run_talkmesh(store, cfg, run_freeze(store, cfg, {}), lambda adapter: FirstFourRight(tok))
    return cfg, rd, refs


def test_tiny_findings_run(tiny_findings):
    """Scripted agents (proposal sample j right iff j < 4): meshes of 4 and 2 agents, two repeats
    each on disjoint sample blocks, and two findings, all known by hand."""
    from tasks.evaluate.findings import verdict

    cfg, tmp_path, refs = tiny_findings
    store = ArtifactStore(tmp_path)
    res = store.rows(refs["talkmesh_results"])
    assert {r["condition"] for r in res} == {"mesh-base", "mesh-base-r1", "mesh-base-n2", "mesh-base-n2-r1"}
    assert all(sum(r["condition"] == c for r in res) == 3 for c in {r["condition"] for r in res})
    summary = {r["condition"]: r for r in store.rows(refs["talkmesh_summary"])}
    for cond, n in (("mesh-base", 4), ("mesh-base-n2", 2)):
        mine = [r for r in res if r["condition"] in (cond, f"{cond}-r1")]
        assert summary[cond]["agents"] == n
        assert summary[cond]["accuracy"] == pytest.approx(sum(r["correct"] for r in mine) / 6)
    # 4 agents: repeat 0 on samples 0-3 (all right), repeat 1 on samples 4-7 (all wrong)
    assert [r["correct"] for r in res if r["condition"] == "mesh-base"] == [True] * 3
    assert [r["correct"] for r in res if r["condition"] == "mesh-base-r1"] == [False] * 3
    # 2 agents: samples 0-1 and 2-3, all right
    assert summary["mesh-base"]["accuracy"] == 0.5 and summary["mesh-base-n2"]["accuracy"] == 1.0
    # the n2 mesh's repeats read samples 0-1 and 2-3 (right, wrong each); repeat 1 of the 4-mesh samples 4-7
    msgs = store.rows(refs["talkmesh_messages"])
    assert sorted({m["agent"] for m in msgs if m["condition"] == "mesh-base-n2-r1"}) == [0, 1]
    curves = {(r["method"], r["k"]): r["accuracy"] for r in store.rows(refs["talkmesh_curves"])}
    budget = store.rows(refs["talkmesh_budget"])
    for r in budget:
        if r["kind"] == "vote":
            assert r["accuracy"] == pytest.approx(curves[(r["series"], r["k"])])
            assert r["ci_low"] <= r["accuracy"] <= r["ci_high"]
        else:
            assert r["accuracy"] == pytest.approx(summary[r["series"]]["accuracy"])
            assert r["outputs_spent"] == summary[r["series"]]["outputs_spent"]
    assert {r["series"] for r in budget if r["kind"] == "mesh"} == {"mesh-base", "mesh-base-n2"}
    equal = {e["condition"]: e for e in store.manifest("talkmesh", "talkmesh_budget")["extra"]["equal_budget"]}
    assert set(equal) == {"mesh-base", "mesh-base-n2"}
    for cond, e in equal.items():
        assert e["k"] == min(max(int(summary[cond]["outputs_spent"] + 0.5), 1), 8)
        assert e["difference"] == pytest.approx(summary[cond]["accuracy"] - curves[("majority", e["k"])])
    found = {f["name"]: f for f in store.rows(refs["talkmesh_findings"])}
    f = found["mesh4-vs-maj8"]
    # majority@8 is a 4:4 tie that goes to the first-seen (right) answer
    assert f["majority_accuracy"] == curves[("majority", 8)] == 1.0
    # every problem: 0.5 - 1 = -0.5, so the interval is [-0.5, -0.5], wholly below -0.4
    assert (f["estimate"], f["ci_low"], f["ci_high"]) == (-0.5, -0.5, -0.5) and f["verdict"] == "not reproduced"
    assert f["level"] == pytest.approx(1 - 0.1 / 2) and f["n"] == 3 and f["condition"] == "mesh-base"
    assert (f["verdict"], f["reason"]) == verdict("equivalent", f["estimate"], f["ci_low"], f["ci_high"], 0.4)
    g = found["mesh2-vs-maj1"]
    assert g["majority_accuracy"] == curves[("majority", 1)] == 1.0 and g["condition"] == "mesh-base-n2"
    assert (g["estimate"], g["verdict"]) == (0.0, "inconclusive")  # 1.0 - 1.0: no increase shown

    rows = published_rows(store, config="x.yaml", config_hash=cfg.config_hash(), commit="abc",
                          freeze_seconds=2.0)
    timing = store.manifest("talkmesh", "talkmesh_summary")["extra"]["timing"]
    assert [r["name"] for r in rows] == ["mesh4-vs-maj8", "mesh2-vs-maj1"]
    r0 = rows[0]
    assert r0["sealed"] is False and r0["key_fingerprint"] is None and r0["control"] is None
    assert (r0["estimate"], r0["ci_low"], r0["ci_high"], r0["verdict"]) == (f["estimate"], f["ci_low"], f["ci_high"],
                                                                            f["verdict"])
    assert r0["wall_s"] == round(timing["total_s"] + 2.0, 1)
    assert set(r0["calibration"]) == {"train", "test"} and 0.0 <= r0["calibration"]["train"]["ece"] <= 1.0
    # no rollout, train or evaluate stage in a harnessrl talkmesh folder: nothing that could lose an attempt
    assert (r0["infra_errors"], r0["infra_planned"], r0["infra_total"]) == ({}, {}, 0)
    report = (tmp_path / "talkmesh" / "report.md").read_text()
    assert "## Pre-registered findings (sealed" in report and f"**{f['verdict']}**" in report
    assert "| mesh-base-n2 | 2 |" in report
    assert (tmp_path / "talkmesh" / "accuracy_vs_outputs.png").read_bytes()[:4] == b"\x89PNG"


def test_published_rows_need_a_findings_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="talkmesh_findings"):
        published_rows(ArtifactStore(tmp_path), config="c", config_hash="h", commit="x")


def test_the_findings_command_publishes_sealed_rows_and_the_figure(tiny_findings, tmp_path, monkeypatch):
    import json

    import yaml
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.naming import run_label

    cfg, rd, _ = tiny_findings
    conf = tmp_path / "tiny-findings.yaml"
    conf.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "findings.jsonl"
    res = CliRunner().invoke(app, ["findings", "-c", str(conf), "--run-dir", str(rd), "--append", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["mesh4-vs-maj8", "mesh2-vs-maj1"]
    from tasks.evaluate.signing import fingerprint

    signer = fingerprint((rd / "talkmesh" / "signing.pub").read_bytes())
    assert all(r["sealed"] is True and r["key_fingerprint"] == signer and "sealed_reason" not in r
               and r["config_hash"] == cfg.config_hash() for r in rows)
    assert (rows[0]["estimate"], rows[0]["verdict"]) == (-0.5, "not reproduced")
    assert (tmp_path / "docs" / "img" / "findings" / f"{run_label(cfg)}--accuracy_vs_outputs.png").is_file()
    # another config's run is refused, not published
    res = CliRunner().invoke(app, ["findings", "-c", str(conf), "--run-dir", str(rd), "--set", "talkmesh.resamples=3"])
    assert res.exit_code == 2 and "NOT THIS RUN" in res.output


def test_pick_problems_keeps_one_task_per_problem():
    import json

    from tasks.talkmesh.run import pick_problems

    def task(h, expr, split="test"):
        return {"task_id": f"t{h}", "task_hash": h, "split": split, "suite": "rg/chain_sum",
                "instruction": f"Solve {expr} =", "metadata": json.dumps({"expression": expr}),
                "verifier_kind": "exact", "verifier_spec": "{}"}

    # "1 + 2" twice (hashes a and c), "(1 + 2)" is the same problem by its expression's AST; "2 + 1" is not
    tasks = [task("c", "1 + 2"), task("a", "1 + 2"), task("b", "2 + 1"), task("d", "(1 + 2)"), task("e", "5 - 3", "train")]
    assert [p.problem_id for p in pick_problems(tasks, "test", 4)] == ["ta", "tb", "tc", "td"]
    assert [p.problem_id for p in pick_problems(tasks, "test", 2, distinct=True)] == ["ta", "tb"]
    with pytest.raises(ValueError, match="3 test problems wanted but the frozen test split has 2 distinct problems"):
        pick_problems(tasks, "test", 3, distinct=True)


def test_published_rows_module_registers_the_contracts_it_reads():
    """`harnessrl findings` imports only tasks.talkmesh.findings before reading the run's
    talkmesh_calibration table; in a fresh interpreter that import alone must register it (the
    findings run of talkmesh-findings failed with 'no artifact contract named ...' without it)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import tasks.talkmesh.findings; from schemas.contracts import get_contract; "
            "[get_contract(n) for n in ('talkmesh_calibration', 'talkmesh_findings', 'talkmesh_summary')]")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
