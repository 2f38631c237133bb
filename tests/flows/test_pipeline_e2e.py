"""The whole pipeline on the tiny model under a real (ephemeral) Prefect API."""

import shutil

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.pipeline import pipeline
from schemas import ArtifactStore
from tasks.config import RunConfig

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]

STAGES = ["freeze", "rollout", "train", "evaluate", "analyze"]


def _cfg(model_dir, **over):
    d = {
        "name": "e2e", "seed": 5,
        "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
                   {"name": "gsm_symbolic", "size": 3, "seed": 1}],
        "split": {"test_fraction": 0.34},
        "harnesses": ["direct", "react-python"],
        "policy": {"model": str(model_dir), "batch_size": 64},
        "rollout": {"samples_per_task": 3},
        "train": {"epochs": 1, "batch_size": 6, "micro_batch_size": 4, "lr": 0.01},
        "evaluate": {"attempts": 2},
        "analyze": {"ceiling_k": 2, "branching": {"episodes_per_harness": 1, "n": 2, "k": 2},
                    "log_odds": {"max_states_per_harness": 3},
                    # test speed: the pipeline's tables are checked, not the intervals' resolution
                    "leakage": {"permutations": 20}, "bootstrap_resamples": 200},
    }
    d.update(over)
    return RunConfig.model_validate(d)


@pytest.fixture(scope="module")
def run(tiny_model_dir, prefect_harness, tmp_path_factory):
    cfg = _cfg(tiny_model_dir)
    rd = tmp_path_factory.mktemp("run")
    result = pipeline(cfg, str(rd))
    return cfg, rd, result


def test_artifacts_have_the_right_contents(run):
    cfg, rd, result = run
    assert [result[s]["state"] for s in STAGES] == ["Completed"] * 5
    store = ArtifactStore(rd)
    tasks = store.rows(("freeze", "tasks"))
    assert len(tasks) == 9
    test_hashes = {t["task_hash"] for t in tasks if t["split"] == "test"}
    train_hashes = {t["task_hash"] for t in tasks if t["split"] == "train"}
    assert len(test_hashes) == 3 and len(train_hashes) == 6 and not test_hashes & train_hashes
    records = store.rows(("freeze", "records"))
    assert len(records) == 18
    episodes = store.rows(("rollout", "episodes"))
    assert len(episodes) == 6 * 2 * 3
    assert {e["task_hash"] for e in episodes} == train_hashes
    assert all(0.0 <= e["reward"] <= 1.0 for e in episodes)
    turns = store.rows(("rollout", "turns"))
    assert len(turns) == sum(e["num_turns"] for e in episodes)
    steps = store.rows(("train", "train_steps"))
    assert [s["step"] for s in steps] == [1, 2]
    ckpts = store.rows(("train", "checkpoints"))
    assert [c["name"] for c in ckpts] == ["base", "final"] and len(ckpts[1]["adapter_sha256"]) == 64
    evals = store.rows(("evaluate", "evaluations"))
    assert len(evals) == 3 * 2 * 2 * 2  # test tasks x harnesses x checkpoints x attempts
    assert {e["task_hash"] for e in evals} == test_hashes
    assert [e["seq"] for e in evals] == list(range(len(evals)))
    mism = store.rows(("analyze", "mismatch"))
    assert len(mism) == 4
    for m in mism:
        cell = [e for e in evals if e["checkpoint"] == m["checkpoint"] and e["harness_name"] == m["harness_name"]]
        assert m["pass_at_1"] == pytest.approx(sum(e["resolved"] for e in cell) / len(cell))
        assert m["ceiling"] >= m["pass_at_1"] and m["mismatch"] == pytest.approx(m["ceiling"] - m["pass_at_1"])
    assert "pass@1" in (rd / "analyze/report.md").read_text()
    # P1 per-step mismatch: one sealed base attempt per harness, every visited state branched twice
    steps = store.rows(("analyze", "step_mismatch"))
    by_ep = {}
    for s in steps:
        by_ep.setdefault(s["episode_id"], []).append(s)
    assert len(by_ep) == 2 and {s["checkpoint"] for s in steps} == {"base"}
    for rows in by_ep.values():
        rows.sort(key=lambda r: r["turn_idx"])
        assert [r["turn_idx"] for r in rows] == list(range(rows[0]["num_turns"]))
        if all(r["step_mismatch"] is not None for r in rows):  # telescoping: sum m_t = V*(s_0) - success
            assert sum(r["step_mismatch"] for r in rows) == pytest.approx(rows[0]["v_star"] - rows[0]["recorded_success"])
    base = {m["harness_name"]: m for m in mism if m["checkpoint"] == "base"}
    for m in base.values():
        if m["mismatch_step"] is not None:
            assert m["predicted_return"] == pytest.approx(m["ceiling"] - m["mismatch_step"])
    # P1 log-odds check of the trained adapter against the base model, at first-turn states
    lo = store.rows(("analyze", "log_odds"))
    assert {r["checkpoint"] for r in lo} == {"final"} and all(1 <= r["n_states"] <= 3 for r in lo)
    pairs = store.rows(("analyze", "log_odds_pairs"))
    assert sum(r["n_pairs"] for r in lo) == len(pairs) > 0
    for p in pairs:
        assert p["logodds_shift"] == pytest.approx(p["logodds_policy"] - p["logodds_ref"])
    # P4 tables: two training harnesses, so the leakage classifier runs under both rules
    lk = {r["rule"]: r for r in store.rows(("analyze", "leakage"))}
    assert set(lk) == {"within", "cross"} and lk["within"]["n_groups"] == 2 * lk["cross"]["n_groups"]


def test_verify_passes_then_fails_after_tampering(run):
    _, rd, _ = run
    cli = CliRunner()
    ok = cli.invoke(app, ["verify", str(rd)])
    assert ok.exit_code == 0, ok.output
    path = rd / "evaluate/evaluations.parquet"
    original = path.read_bytes()
    try:
        t = pq.read_table(path).to_pylist()
        t[3]["reward"] = 1.0 - t[3]["reward"]
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(t, schema=pq.read_schema(path)), path)
        bad = cli.invoke(app, ["verify", str(rd)])
        assert bad.exit_code == 1 and "row 3" in bad.output
    finally:
        path.write_bytes(original)
    assert cli.invoke(app, ["verify", str(rd)]).exit_code == 0


def test_rerun_is_cached_and_from_forces_the_tail(run):
    cfg, rd, first = run
    again = pipeline(cfg, str(rd))
    assert [again[s]["state"] for s in STAGES] == ["Cached"] * 5
    for s in STAGES:
        assert {k: v.sha256 for k, v in again[s]["outputs"].items()} == {k: v.sha256 for k, v in first[s]["outputs"].items()}
    # (a forced evaluate's byte-identity is test_same_config_in_a_new_folder_gives_identical_artifacts's
    # and tests/evaluate/test_stage.py's; here the tail is the last stage alone)
    forced = pipeline(cfg, str(rd), "analyze")
    assert [forced[s]["state"] for s in STAGES] == ["Cached", "Cached", "Cached", "Cached", "Completed"]
    # same config and seed on the CPU: the re-run analysis is byte-identical
    assert {k: v.sha256 for k, v in forced["analyze"]["outputs"].items()} == \
           {k: v.sha256 for k, v in first["analyze"]["outputs"].items()}


def test_same_config_in_a_new_folder_gives_identical_artifacts(run, tmp_path):
    cfg, _, first = run
    second = pipeline(cfg, str(tmp_path / "again"))
    for s in STAGES:
        assert {k: v.sha256 for k, v in second[s]["outputs"].items()} == \
               {k: v.sha256 for k, v in first[s]["outputs"].items()}, s


def test_cli_run_resumes_at_the_failed_stage(tiny_model_dir, prefect_harness, tmp_path, monkeypatch):
    import yaml

    import tasks.analysis.ceiling as analysis_ceiling

    # what resumes is the stage order, not the sizes: one suite of 4 tasks, one harness
    cfg = _cfg(tiny_model_dir, name="resume", seed=9, harnesses=["direct"],
               suites=[{"name": "basic_arithmetic", "size": 4, "seed": 1,
                        "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
               split={"test_fraction": 0.25})
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    rd = tmp_path / "run"
    cli = CliRunner()

    def broken(*a, **k):
        raise RuntimeError("analysis exploded")

    monkeypatch.setattr(analysis_ceiling, "mismatch_cells", broken)
    first = cli.invoke(app, ["run", "--config", str(cfg_path), "--run-dir", str(rd)])
    assert first.exit_code != 0
    assert (rd / "evaluate/evaluations.parquet").is_file() and not (rd / "analyze/mismatch.parquet").exists()
    monkeypatch.undo()
    second = cli.invoke(app, ["run", "--config", str(cfg_path), "--run-dir", str(rd)])
    assert second.exit_code == 0, second.output
    states = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in second.output.splitlines()
              if line.startswith("│") and line.split("│")[1].strip() in STAGES}
    assert states == {"freeze": "Cached", "rollout": "Cached", "train": "Cached", "evaluate": "Cached",
                      "analyze": "Completed"}
    assert "report:" in second.output and (rd / "analyze/report.md").is_file()
    bad = cli.invoke(app, ["run", "--config", str(cfg_path), "--from", "nowhere"])
    assert bad.exit_code == 2 and "not a stage" in bad.output


def test_online_off_policy_training_stage_on_the_frozen_records(run, tiny_model_dir, tmp_path):
    """The train stage in online mode: a fresh batch of 3 tasks per iteration from a policy at
    most one version behind."""
    from tasks.train.stage import run_train

    cfg, rd, first = run
    store = ArtifactStore(rd)
    frozen, rollouts = first["freeze"]["outputs"], first["rollout"]["outputs"]
    online_cfg = _cfg(tiny_model_dir, train={"steps": 3, "micro_batch_size": 8, "lr": 0.01, "mode": "online",
                                             "max_staleness": 1, "prompts_per_step": 3}, rollout={"samples_per_task": 2})
    out_store = ArtifactStore(tmp_path / "online")
    for name in ("tasks", "harnesses", "records"):
        out_store.write("freeze", name, store.read(frozen[name]))
    for name in ("episodes", "turns"):
        out_store.write("rollout", name, store.read(rollouts[name]))
    inputs = {n: out_store.ref("freeze", n) for n in ("tasks", "harnesses", "records")}
    inputs.update({n: out_store.ref("rollout", n) for n in ("episodes", "turns")})
    outs = run_train(out_store, online_cfg, inputs)
    steps = out_store.rows(outs["train_steps"])
    assert [s["policy_version_sampled"] for s in steps] == [0, 0, 1]  # batch 2 sampled while batch 1 trained
    assert [s["staleness"] for s in steps] == [0, 1, 1]
    eps = out_store.rows(outs["online_episodes"])
    assert len(eps) == 3 * 3 * 2 * 2  # 3 sampled batches x 3 tasks x 2 harnesses x 2 samples
    assert sorted({e["policy_version"] for e in eps}) == [0, 1]
    per_iter = [sorted({e["task_id"] for e in eps[i * 12:(i + 1) * 12]}) for i in range(3)]
    assert all(len(t) == 3 for t in per_iter) and len(set(per_iter[0]) | set(per_iter[1])) == 6  # a pass: all 6
    test_hashes = {t["task_hash"] for t in store.rows(frozen["tasks"]) if t["split"] == "test"}
    assert not {e["task_hash"] for e in eps} & test_hashes


def test_sealed_statistics_and_exports_of_the_run(run):
    """The matrix, the pre-registered contrasts (final - base per harness) and the exports."""
    cfg, rd, result = run
    store = ArtifactStore(rd)
    outs = result["evaluate"]["outputs"]
    evals = store.rows(outs["evaluations"])
    cells = store.rows(outs["eval_cells"])
    cons = store.rows(outs["eval_contrasts"])
    print("\nmatrix (pass@1; graded/planned):")
    for c in cells:
        print(f"  {c['kind']:8} {c['checkpoint']:6} trained on {c['train_harnesses'] or '-':20} {c['harness_name']:13} "
              f"pass@1={c['pass_at_1']} pass@{c['k']}={c['pass_at_k']} graded={c['graded']}/{c['planned']} "
              f"counted={c['counted']}")
    for c in cons:
        print(f"  contrast {c['name']}: {c['estimate']} CI [{c['ci_low']}, {c['ci_high']}] (level 1-{c['alpha']}/"
              f"{c['m_contrasts']}), p_bonf={c['p_bonferroni']}, MDD={c['mdd']}, n_tasks={c['n_tasks']}")
    assert [c["name"] for c in cons] == ["final-vs-base:direct", "final-vs-base:react-python"]
    for c in cells:
        if c["kind"] != "cell":
            continue
        cell = [e for e in evals if e["checkpoint"] == c["checkpoint"] and e["harness_name"] == c["harness_name"]]
        assert c["planned"] == len(cell) == 3 * 2 and c["graded"] == sum(e["status"] != "infra_error" for e in cell)
        if c["counted"]:
            assert c["pass_at_1"] == pytest.approx(sum(e["resolved"] for e in cell) / len(cell))
    for c in cons:
        assert c["resamples"] == 10_000 and c["m_contrasts"] == 2
        if c["status"] == "ok":
            assert c["ci_low"] <= c["estimate"] <= c["ci_high"] and c["n_tasks"] == 3
    from inspect_ai.log import read_eval_log

    from tasks.evaluate.exports import check_inspect_logs

    logs = [read_eval_log(str(p)) for p in sorted((rd / "evaluate/inspect").glob("*.eval"))]
    assert len(logs) == 2 * 2 and sum(len(x.samples) for x in logs) == len(evals)  # no retries here
    assert {x.eval.metadata["chain_head"] for x in logs} == {evals[-1]["seal_hash"]}
    assert check_inspect_logs(str(rd)) == []
    reports = sorted((rd / "evaluate/exports/swebench").glob("*.report.json"))
    assert len(reports) == 2 * 2 * 2  # checkpoints x harnesses x attempts
