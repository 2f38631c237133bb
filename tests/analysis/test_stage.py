"""The analyze stage end to end on a scripted sealed evaluation (no model): every table, the
figures, the report, and the Prefect artifacts the UI shows."""

import json
import math

import pytest

from schemas import ArtifactStore
from tasks.analysis.stage import REPORT, run_analyze
from tasks.config import RunConfig
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.stage import run_evaluate
from tasks.hashing import seed_from, sha256_dir
from tasks.records.freeze import freeze_tables

PNG = b"\x89PNG\r\n\x1a\n"


def _cfg():
    return RunConfig.model_validate({
        "name": "analysis", "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 40, "seed": 2}],
        "split": {"test_fraction": 0.5}, "harnesses": ["direct", "react-python"],
        "train": {"kl": {"beta": 0.5}},
        "evaluate": {"attempts": 4, "harnesses": ["direct", "react-python", "qwen-code-like"],
                     "bootstrap_resamples": 500},
        "analyze": {"ceiling_k": 4, "bootstrap_resamples": 300, "leakage": {"permutations": 50},
                    "log_odds": {"max_states_per_harness": 0}},
    })


def _training_episodes(records, p_success):
    """Rollouts of the train records, 4 samples each; success drawn with the harness's rate."""
    eps = []
    for r in records:
        if r["split"] != "train":
            continue
        for i in range(4):
            ok = seed_from(7, r["record_id"], i) / float(1 << 60) < p_success[r["harness_name"]]
            eps.append({"episode_id": f"{r['record_id'][:16]}-{i}", "record_id": r["record_id"], "task_id": r["task_id"],
                        "task_hash": r["task_hash"], "harness_id": r["harness_id"], "harness_name": r["harness_name"],
                        "split": "train", "policy_id": "p", "policy_version": 0,
                        "group_id": f"{r['task_id']}|{r['harness_id']}", "sample_idx": i, "seed": i,
                        "reward": float(ok), "success": ok, "status": "ok", "stop_reason": "submitted",
                        "num_turns": 1, "input_tokens": 5, "output_tokens": 3, "final_answer": "1",
                        "answer_parsed": True})
    return eps


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analyze")
    cfg = _cfg()
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp / "run")
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    refs["episodes"] = store.write("rollout", "episodes", _training_episodes(records, {"direct": 0.9,
                                                                                          "react-python": 0.1}))
    refs["turns"] = store.write("rollout", "turns", [])
    ckpts = [{"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "m"}]
    for name in ("within", "cross"):
        ad = tmp / name
        ad.mkdir()
        (ad / "adapter_model.safetensors").write_bytes(name.encode())
        store.put_dir(f"train/checkpoints/{name}/step-2", ad)
        ckpts.append({"name": name, "step": 2, "path": f"train/checkpoints/{name}/step-2",
                      "adapter_sha256": sha256_dir(ad), "base_model_id": "m"})
    refs["checkpoints"] = store.write("train", "checkpoints", ckpts)
    steps = [{"arm": a, "step": s, "epoch": 0, "ppo_epoch": 0, "batch_index": s - 1, "loss": 0.1 / s,
              "policy_loss": 0.1, "kl": 0.001 * s, "kl_penalty": 0.0001 * s, "entropy": 1.0, "clip_frac": 0.05,
              "ratio_min": 0.9, "ratio_mean": 1.0, "ratio_max": 1.1, "grad_norm": 0.5, "reward_mean": 0.3 + 0.1 * s,
              "zero_adv_frac": 0.4, "lr": 1e-4, "tokens": 100, "sequences": 8, "policy_version_sampled": 0,
              "staleness": s - 1, "logp_mismatch_mean": 0.01, "logp_mismatch_max": 0.1,
              "sync_max_abs_logp_diff": float("nan"), "dropped": "{}"} for a in ("within", "cross") for s in (1, 2)]
    refs["train_steps"] = store.write("train", "train_steps", steps)
    runner = ScriptedRunner(p_resolve={"direct": 0.6, "react-python": 0.3, "qwen-code-like": 0.2}, seed=1,
                            tool_harnesses=("react-python", "qwen-code-like"))
    refs.update(run_evaluate(store, cfg, refs, episode_runner=runner))
    out = run_analyze(store, cfg, refs)
    return cfg, store, refs, out


def test_mismatch_agrees_with_the_sealed_cells_and_the_soft_ceiling(analyzed):
    cfg, store, refs, out = analyzed
    mism = store.rows(out["mismatch"])
    evals = store.rows(refs["evaluations"])
    assert all(e["retry"] == 0 for e in evals)  # no retries here: every row is a final attempt
    cells = {(c["checkpoint"], c["harness_name"]): c for c in store.rows(refs["eval_cells"]) if c["kind"] == "cell"}
    assert len(mism) == 3 * 3 and {(m["checkpoint"], m["harness_name"]) for m in mism} == set(cells)
    for m in mism:
        c = cells[(m["checkpoint"], m["harness_name"])]
        # two independent computations of the same figures: the evaluate stage's and the analysis's
        assert m["pass_at_1"] == pytest.approx(c["pass_at_1"]) and m["ceiling"] == pytest.approx(c["pass_at_k"])
        assert m["mismatch"] == pytest.approx(m["ceiling"] - m["pass_at_1"])
        p = cells[("base", m["harness_name"])]["pass_at_1"]
        # b is analyze.kl_beta's default 1.0, not the trainer's train.kl.beta = 0.5
        assert m["ref_pass_at_1"] == pytest.approx(p) and m["kl_beta"] == 1.0
        # per task, then averaged, from the base's sealed rows under the harness
        rates = {}
        for e in evals:
            if e["checkpoint"] == "base" and e["harness_name"] == m["harness_name"] and e["status"] != "infra_error":
                rates.setdefault(e["task_id"], []).append(float(e["resolved"]))
        js = [(q := sum(v) / len(v)) * math.e / (1 - q + q * math.e) for v in rates.values()]
        assert m["ceiling_kl_soft"] == pytest.approx(sum(js) / len(js), abs=1e-12)
        assert m["mismatch_step"] is None and m["predicted_return"] is None


def test_predictors_cover_both_targets_over_the_trained_points(analyzed):
    _, store, _, out = analyzed
    from tasks.analysis.predictors import NOT_MEASURED_STEP

    rows = store.rows(out["predictors"])
    assert {(r["target"], r["predictor"]) for r in rows} == {
        (t, p) for t in ("gain", "return") for p in ("C", "C_kl_soft", "M", "M_step", "C_minus_M", "C_minus_M_step")}
    for r in rows:
        if r["predictor"] in ("M_step", "C_minus_M_step"):  # no branching in this config
            assert r["na_reason"] == NOT_MEASURED_STEP and r["r2"] is None and r["n_points"] == 0
            continue
        assert r["n_points"] == 2 * 3  # (within, cross) x 3 evaluation harnesses
        assert r["na_reason"] == "" and 0.0 <= r["r2"] <= 1.0 and r["ci_low"] <= r["ci_high"]
    pts = store.rows(out["p1_points"])
    assert {(p["checkpoint"], p["harness_name"]) for p in pts} == {
        (a, h) for a in ("within", "cross") for h in ("direct", "react-python", "qwen-code-like")}
    mism = {(m["checkpoint"], m["harness_name"]): m for m in store.rows(out["mismatch"])}
    for p in pts:
        base, ck = mism[("base", p["harness_name"])], mism[(p["checkpoint"], p["harness_name"])]
        assert (p["C"], p["C_kl_soft"], p["M"]) == pytest.approx((base["ceiling"], base["ceiling_kl_soft"], base["mismatch"]))
        assert p["C_minus_M"] == pytest.approx(base["pass_at_1"]) and p["M_step"] is None
        assert p["gain"] == pytest.approx(ck["pass_at_1"] - base["pass_at_1"])


def test_cross_grouping_leaks_the_harness_and_within_does_not(analyzed):
    _, store, _, out = analyzed
    lk = {r["rule"]: r for r in store.rows(out["leakage"])}
    # success 0.9 vs 0.1: pooled per task, the advantage tells the harness apart; per harness it cannot
    assert lk["cross"]["leakage_pp"] > 20 and lk["cross"]["ci_low"] > 0
    assert abs(lk["within"]["leakage_pp"]) < 10
    assert lk["within"]["zero_group_fraction"] > lk["cross"]["zero_group_fraction"]
    assert lk["within"]["n_groups"] == 2 * lk["cross"]["n_groups"]


def test_action_jsd_separates_harnesses_not_checkpoints(analyzed):
    _, store, _, out = analyzed
    rows = store.rows(out["action_jsd"])
    between_h = {(r["harness_a"], r["harness_b"]): r["jsd_bits"] for r in rows if r["scope"] == "between_harnesses"}
    # direct answers, the others call the submit tool: disjoint action kinds
    assert between_h[("direct", "react-python")] == pytest.approx(1.0)
    assert between_h[("qwen-code-like", "react-python")] == pytest.approx(0.0)
    assert all(r["jsd_bits"] == pytest.approx(0.0) for r in rows if r["scope"] == "between_checkpoints")


def out_ev(store):
    return store.ref("evaluate", "eval_cells")


def test_report_and_figures(analyzed):
    _, store, _, out = analyzed
    report = store.read_bytes(REPORT).decode()
    for section in ("## Sealed evaluation", "## P1: harness ceiling minus mismatch", "## P4: Within vs Cross grouping",
                    "qwen-code-like (held out)", "R^2"):
        assert section in report
    # the infra errors per stage, read from the artifacts: none in this scripted run (no online arm)
    n_eps = store.manifest("rollout", "episodes")["rows"]
    planned = sum(c["planned"] for c in store.rows(out_ev(store)) if c["kind"] == "cell")
    assert f"| rollout | {n_eps} episodes | 0 | 0.000 | none |" in report
    assert "| train | 0 episodes | 0 | n/a (none planned) | none |" in report
    assert f"| evaluate | {planned} attempts | 0 | 0.000 | 0 |" in report and planned == 20 * 3 * 3 * 4
    figs = store.list_files("analyze/plots")
    assert [f.rsplit("/", 1)[-1] for f in figs] == ["action_jsd.png", "ceiling_vs_return.png", "leakage.png", "learning_curves.png",
                                                   "pass_rate_heatmap.png", "r2_comparison.png",
                                                   "step_failures.png"]
    for f in figs:
        assert store.read_bytes(f).startswith(PNG)
        assert f"]({f.removeprefix('analyze/')})" in report


def test_no_table_cell_of_the_report_is_blank(analyzed):
    """Every cell of every table in the report has a value or says n/a (with the reason in the cell or
    in a note under the table); a note is printed once in the whole report."""
    import re

    _, store, _, _ = analyzed
    report = store.read_bytes(REPORT).decode()
    rows = [ln for ln in report.splitlines() if ln.startswith("|") and not set(ln) <= set("|-: ")]
    assert len(rows) > 50
    blank = [ln for ln in rows if any(not c.strip() for c in ln.strip()[1:-1].split(" | "))]
    assert not blank, blank[:5]
    notes = re.findall(r"^\[(\d+)\] ", report, re.M)
    assert len(notes) == len(set(notes)), notes  # a note numbered once, printed once
    refs = set(re.findall(r"\[(\d+)\]", "\n".join(rows)))
    assert refs <= set(notes) and notes == [str(i) for i in range(1, len(notes) + 1)]
    assert "n/a [" in report  # the scripted run has undefined R^2s: n/a with a numbered reason


def test_the_same_inputs_give_identical_tables_and_figures(analyzed):
    cfg, store, refs, out = analyzed
    pngs = {f: store.read_bytes(f) for f in store.list_files("analyze/plots")}
    second = run_analyze(store, cfg, refs)
    assert {k: v.sha256 for k, v in second.items()} == {k: v.sha256 for k, v in out.items()}
    assert {f: store.read_bytes(f) for f in store.list_files("analyze/plots")} == pngs


def test_publish_report_shows_tables_and_figures_in_prefect(analyzed, prefect_harness):
    from markdown_it import MarkdownIt
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_UI_URL

    from flows.naming import flow_run_namer, run_label, tagged
    from flows.stages import publish_report

    cfg, store, _, _ = analyzed
    cfg = cfg.model_copy(update={"name": "p1-analysis"})

    @flow(flow_run_name=flow_run_namer())
    def show(cfg: RunConfig):
        return publish_report(store.url, label=run_label(cfg))

    with tagged(cfg):
        state = show(cfg, return_state=True)
    keys = state.result()
    assert keys[-1] == "harnessrl-report" and "harnessrl-mismatch" in keys and "harnessrl-leakage" in keys
    assert "harnessrl-p1-points" in keys and "harnessrl-report-file" in keys and "harnessrl-eval-cells" in keys

    import asyncio

    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey,
                                                FlowRunFilter, FlowRunFilterParentFlowRunId)

    top_id = state.state_details.flow_run_id

    async def fetch():  # this flow run's artifacts only: tests beside this one publish the same keys
        async with get_client() as c:
            subs = await c.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[top_id])))
            return await c.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=keys), flow_run_id=ArtifactFilterFlowRunId(any_=[top_id, *[r.id for r in subs]])))

    arts = {a.key: a for a in asyncio.run(fetch())}
    report = arts["harnessrl-report"].data
    figs = store.list_files("analyze/plots")
    assert "](plots/" not in report and report.count("](data:image/png;base64,") == len(figs) == 7
    assert arts["harnessrl-report"].flow_run_id != arts["harnessrl-mismatch"].flow_run_id  # tables: a subflow run
    # the link opens the report artifact's page in the UI that shows it, not a file:// URL a browser blocks
    ui = PREFECT_UI_URL.value()
    assert ui and ui.startswith("http://")
    assert arts["harnessrl-report-file"].data == f"[the run's report]({ui}/artifacts/artifact/{arts['harnessrl-report'].id})"
    # the key columns first, every number rounded to 3 places, no blank cell
    cells = json.loads(arts["harnessrl-eval-cells"].data)
    assert list(cells[0])[:3] == ["checkpoint", "harness_name", "pass_at_1"]
    for name in ("harnessrl-eval-cells", "harnessrl-mismatch", "harnessrl-predictors", "harnessrl-leakage"):
        for r in json.loads(arts[name].data):
            assert all(v is not None and v != "" for v in r.values()), (name, r)
            assert all(round(v, 3) == v for v in r.values() if isinstance(v, float)), (name, r)
    # a string cell renders as itself (the UI renders each as Markdown): the aggregate rows' "*" is no bullet
    stars = [r for r in cells if r["kind"] == "col\\_mean"]  # escaped too: "col_mean" as Markdown
    assert stars and all(r["checkpoint"] == "\\*" for r in stars)
    md = MarkdownIt("commonmark")
    for r in cells:
        for v in r.values():
            if isinstance(v, str) and v:
                html = md.render(v)
                assert html.startswith("<p>") and "<li>" not in html and "<em>" not in html, (v, html)
    # the subflow run that holds the tables is named and tagged from the config
    with get_client(sync_client=True) as client:
        top = client.read_flow_run(state.state_details.flow_run_id)
        tables_run = client.read_flow_run(arts["harnessrl-mismatch"].flow_run_id)
    assert top.name == run_label(cfg) and tables_run.name == f"report-tables · {run_label(cfg)}"
    assert sorted(tables_run.tags) == ["P1", "p1-analysis"]



def test_step_failures_cover_every_cell_and_agree_with_the_sealed_counts(analyzed):
    cfg, store, refs, out = analyzed
    steps = store.rows(out["step_failures"])
    cells = {(c["checkpoint"], c["harness_name"]): c for c in store.rows(refs["eval_cells"]) if c["kind"] == "cell"}
    assert {(r["checkpoint"], r["harness_name"]) for r in steps} == set(cells)
    for r in steps:
        c = cells[(r["checkpoint"], r["harness_name"])]
        assert r["graded"] == c["graded"] and r["solved"] + r["failed"] == r["graded"]
        # the same attempts per task and no infra error here: pass@1 = solved / graded
        assert r["solved"] / r["graded"] == pytest.approx(c["pass_at_1"])
        if r["failed"] and not r["note"]:
            assert sum(r[f"failed_{k}"] for k in ("timeout", "max_tokens", "format_error", "max_turns",
                                                   "submitted")) == r["failed"]
    assert "## P6: agent steps and failure modes" in store.read_bytes(REPORT).decode()
