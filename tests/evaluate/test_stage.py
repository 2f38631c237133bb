"""The evaluate stage end to end with a scripted runner (no model): plan, retries, coverage,
held-out column, statistics, exports, and ``harnessrl verify`` against every kind of tampering."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas import ArtifactError, ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.seal import SealError
from tasks.evaluate.stage import PLAN, run_evaluate
from tasks.evaluate.verify import verify_run
from tasks.hashing import sha256_dir
from tasks.records.freeze import freeze_tables
from tasks.records.split_guard import LeakageError


def _cfg(**evaluate):
    ev = {"attempts": 3, "harnesses": ["direct", "react-python"], "bootstrap_resamples": 2000, **evaluate}
    return RunConfig.model_validate({"name": "sealed", "seed": 3,
                                     "suites": [{"name": "basic_arithmetic", "size": 40, "seed": 2}],
                                     "split": {"test_fraction": 0.5}, "harnesses": ["direct"], "evaluate": ev,
                                     "analyze": {"ceiling_k": 2}})


def _episode(rec, split="train", version=0):
    """An episode row of the record ``rec`` (labelled ``split``)."""
    return {"episode_id": "e0", "record_id": rec["record_id"], "task_id": rec["task_id"], "task_hash": rec["task_hash"],
            "harness_id": rec["harness_id"], "harness_name": rec["harness_name"], "split": split, "policy_id": "p",
            "policy_version": version, "group_id": "g", "sample_idx": 0, "seed": 0, "reward": 1.0, "success": True,
            "status": "ok", "stop_reason": "submitted", "num_turns": 1, "input_tokens": 3, "output_tokens": 2,
            "final_answer": "1", "answer_parsed": True}


def _store(tmp_path, cfg):
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp_path / "run")
    train_rec = next(r for r in records if r["split"] == "train")  # an episodes artifact may not be empty
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records),
            "episodes": store.write("rollout", "episodes", [_episode(train_rec)])}
    ad = tmp_path / "adapter"
    ad.mkdir()
    (ad / "adapter_model.safetensors").write_bytes(b"weights-v1")
    store.put_dir("train/checkpoints/step-2", ad)
    refs["checkpoints"] = store.write("train", "checkpoints", [
        {"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "m"},
        {"name": "final", "step": 2, "path": "train/checkpoints/step-2", "adapter_sha256": sha256_dir(ad),
         "base_model_id": "m"}])
    return store, refs, tasks, records


def _run(tmp_path, cfg=None, runner=None):
    cfg = cfg or _cfg(infra_retries=1)
    store, refs, tasks, records = _store(tmp_path, cfg)
    runner = runner or ScriptedRunner(p_resolve={"direct": 0.5, "react-python": 0.3}, infra_rate=0.05, seed=1)
    out = run_evaluate(store, cfg, refs, episode_runner=runner)
    return cfg, store, refs, out, runner, tasks, records


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("sealed"))


def test_freeze_builds_test_only_records_for_the_held_out_harness():
    cfg = _cfg()
    tasks, harnesses, records = freeze_tables(cfg)
    test_ids = {t["task_id"] for t in tasks if t["split"] == "test"}
    held = [r for r in records if r["harness_name"] == "react-python"]
    assert {r["task_id"] for r in held} == test_ids and {r["split"] for r in held} == {"test"}
    assert [h["name"] for h in harnesses] == ["direct", "react-python"]
    # without evaluation-only harnesses freeze is exactly as before
    plain = RunConfig.model_validate({**cfg.model_dump(mode="json"), "evaluate": {"attempts": 3}})
    assert all(r["harness_name"] == "direct" for r in freeze_tables(plain)[2])


def test_plan_holds_contrasts_held_out_column_and_rules(sealed):
    cfg, store, *_ = sealed
    plan = store.read_json(PLAN)
    assert plan["held_out"] == ["react-python"] and plan["harnesses"] == ["direct", "react-python"]
    assert [c["name"] for c in plan["contrasts"]] == ["final-vs-base:direct", "final-vs-base:react-python"]
    assert plan["contrasts"][0]["a"] == {"checkpoint": "final", "harness": "direct"}
    assert plan["min_graded_fraction"] == 0.95 and plan["infra_retries"] == 1
    assert [c["train_harnesses"] for c in plan["checkpoints"]] == ["", "direct"]
    assert store.read_bytes("evaluate/plan.sha256").decode().strip() == store.manifest("evaluate", "evaluations")[
        "extra"]["plan_hash"]


def test_infra_errors_are_retried_as_new_rows_that_keep_the_original(sealed):
    cfg, store, refs, out, runner, *_ = sealed
    rows = store.rows(out["evaluations"])
    n_test = len({r["task_id"] for r in rows})
    first = [r for r in rows if r["retry"] == 0]
    assert len(first) == n_test * 2 * 2 * 3  # tasks x harnesses x checkpoints x attempts
    retried = [r for r in rows if r["retry"] == 1]
    originals = {r["eval_id"]: r for r in first if r["status"] == "infra_error"}
    assert originals and len(retried) == len(originals)
    assert {r["retry_of"] for r in retried} == set(originals)
    assert all(r["seq"] > originals[r["retry_of"]]["seq"] for r in retried)
    assert [c[0] for c in runner.calls if "retry" in c[0]]  # the runner was called again for the retries
    assert verify_run(store).rows == len(rows)


def test_cells_leave_infra_errors_out_and_apply_the_coverage_rule(sealed):
    cfg, store, refs, out, *_ = sealed
    rows = store.rows(out["evaluations"])
    cells = {(c["kind"], c["checkpoint"], c["harness_name"]): c for c in store.rows(out["eval_cells"])}
    for ck in ("base", "final"):
        for h in ("direct", "react-python"):
            c = cells[("cell", ck, h)]
            last = {}
            for r in rows:
                if r["checkpoint"] == ck and r["harness_name"] == h:
                    last[(r["record_id"], r["attempt"])] = r  # retries come later in the chain
            graded = [r for r in last.values() if r["status"] != "infra_error"]
            assert c["graded"] == len(graded) and c["infra_errors"] == len(last) - len(graded)
            assert c["graded_fraction"] == pytest.approx(len(graded) / len(last))
            assert c["counted"] == (c["graded_fraction"] >= 0.95)
            assert c["held_out"] == (h == "react-python")
            if c["counted"]:
                per = {}
                for r in graded:
                    per.setdefault(r["task_id"], []).append(r["resolved"])
                assert c["pass_at_1"] == pytest.approx(sum(sum(v) / len(v) for v in per.values()) / len(per))
    row_mean = cells[("row_mean", "final", "*")]
    counted = [cells[("cell", "final", h)]["pass_at_1"] for h in ("direct", "react-python")
               if cells[("cell", "final", h)]["counted"]]
    assert row_mean["pass_at_1"] == pytest.approx(sum(counted) / len(counted))


def test_a_cell_below_the_graded_fraction_does_not_count(tmp_path):
    cfg = _cfg(infra_retries=0, min_graded_fraction=0.99)
    _, store, _, out, *_ = _run(tmp_path, cfg, ScriptedRunner(infra_rate=0.2, seed=4))
    cells = [c for c in store.rows(out["eval_cells"]) if c["kind"] == "cell"]
    assert cells and not any(c["counted"] for c in cells) and all(c["pass_at_1"] is None for c in cells)
    cons = store.rows(out["eval_contrasts"])
    assert {c["status"] for c in cons} == {"cell_not_counted"} and all(c["estimate"] is None for c in cons)


def test_contrasts_are_paired_on_tasks_and_bonferroni_corrected(sealed):
    cfg, store, refs, out, *_ = sealed
    rows = store.rows(out["evaluations"])
    cons = {c["name"]: c for c in store.rows(out["eval_contrasts"])}
    c = cons["final-vs-base:react-python"]
    assert c["held_out"] and c["m_contrasts"] == 2 and c["resamples"] == 2000
    if c["status"] == "ok":
        assert c["ci_low"] <= c["estimate"] <= c["ci_high"]
        assert c["estimate"] == pytest.approx(c["a_mean"] - c["b_mean"])
        assert c["p_bonferroni"] == pytest.approx(min(1.0, 2 * c["p_value"]))
        assert c["mdd"] > 0


def test_exports_are_readable_without_harnessrl(sealed):
    cfg, store, refs, out, *_ = sealed
    rows = store.rows(out["evaluations"])
    root = store.root + "/evaluate"
    model = "sealed.final.direct.attempt0"
    preds = [json.loads(x) for x in open(f"{root}/exports/swebench/{model}.predictions.jsonl")]
    rep = json.load(open(f"{root}/exports/swebench/{model}.report.json"))
    last = {}
    for r in rows:
        if r["checkpoint"] == "final" and r["harness_name"] == "direct" and r["attempt"] == 0:
            last[r["task_id"]] = r
    assert {p["instance_id"] for p in preds} == set(last) and {p["model_name_or_path"] for p in preds} == {model}
    assert all(p["model_patch"] == last[p["instance_id"]]["final_answer"] for p in preds)
    assert rep["resolved_ids"] == sorted(t for t, r in last.items() if r["status"] == "resolved")
    assert rep["error_ids"] == sorted(t for t, r in last.items() if r["status"] == "infra_error")
    assert rep["resolved_instances"] + rep["unresolved_instances"] + rep["error_instances"] == len(last)


def test_inspect_logs_read_back_with_inspect_and_match_the_seal(sealed):
    from inspect_ai.log import read_eval_log

    from tasks.evaluate.exports import check_inspect_logs
    from tasks.evaluate.stats import final_attempts

    cfg, store, refs, out, *_ = sealed
    rows = store.rows(out["evaluations"])
    plan = store.read_json(PLAN)
    ph = store.read_bytes("evaluate/plan.sha256").decode().strip()
    finals = final_attempts(rows)
    by_task = {t["task_id"]: t for t in store.rows(refs["tasks"])}
    turns_by_ep: dict[str, list] = {}
    for t in store.rows(out["eval_turns"]):
        turns_by_ep.setdefault(t["episode_id"], []).append(t)
    task_ids: list[str] = []
    names = sorted(p.rsplit("/", 1)[-1] for p in store.list_files("evaluate/inspect"))
    assert names == sorted(f"{c['name']}.{h}.eval" for c in plan["checkpoints"] for h in plan["harnesses"])
    for ck in plan["checkpoints"]:
        for h in plan["harnesses"]:
            log = read_eval_log(f"{store.root}/evaluate/inspect/{ck['name']}.{h}.eval")
            assert log.status == "success" and log.eval.task == f"sealed/{h}" and log.eval.run_id == ph
            assert log.eval.metadata["plan_hash"] == ph and log.eval.metadata["chain_head"] == rows[-1]["seal_hash"]
            assert log.eval.config.epochs == 3 and log.eval.metadata["held_out"] == (h in plan["held_out"])
            want = {(r["task_id"], r["attempt"] + 1): r for k, r in finals.items() if k[:2] == (ck["name"], h)}
            got = {(s.id, s.epoch): s for s in log.samples}
            assert set(got) == set(want) and log.results.total_samples == len(want)
            for key, s in got.items():
                r = want[key]
                assert s.metadata["seal_hash"] == r["seal_hash"] and s.metadata["seq"] == r["seq"]
                # stable message ids, from the sealed row (Inspect would draw random ones)
                assert [m.id for m in s.messages] == [f"{r['eval_id'][:16]}-m{i}" for i in range(len(s.messages))]
                if r["status"] == "infra_error":
                    assert s.scores is None and "infrastructure error" in s.error.message
                else:
                    assert s.scores["resolved"].value == ("C" if r["resolved"] else "I")
                    assert s.scores["reward"].value == r["reward"]
                    assert s.messages[0].role == "system" and s.messages[1].content == s.input
                    # why: the parsed answer against the expected one
                    expected = json.loads(by_task[s.id]["verifier_spec"])["answer"]
                    assert s.target == expected
                    assert s.scores["resolved"].explanation.startswith(
                        f"{'correct' if r['resolved'] else ('timed out' if r['status'] == 'timeout' else 'incorrect')}"
                        f": parsed answer {r['final_answer'] or ''!r} vs expected {expected!r}")
                # one model event per turn, with the turn's prompt and completion token counts
                ep_turns = sorted(turns_by_ep.get(r["eval_id"], []), key=lambda t: t["turn_idx"])
                assert [e.event for e in s.events] == ["model"] * len(ep_turns) and len(ep_turns) == r["num_turns"]
                n_in = 0
                for e, t, prev in zip(s.events, ep_turns, [None, *ep_turns]):
                    n_in = (n_in + len(prev["completion_token_ids"]) if t["prompt_continues"] else 0) \
                        + len(t["prompt_added_ids"])
                    assert (e.output.usage.input_tokens, e.output.usage.output_tokens) == (
                        n_in, len(t["completion_token_ids"]))
                    assert e.output.completion == t["completion_text"] and e.model == log.eval.model
                assert sum(e.output.usage.output_tokens for e in s.events) == r["output_tokens"]
            cell = next(c for c in store.rows(out["eval_cells"]) if c["kind"] == "cell"
                        and (c["checkpoint"], c["harness_name"]) == (ck["name"], h))
            metrics = log.results.scores[0].metrics
            if cell["counted"]:
                assert metrics["pass_at_1"].value == pytest.approx(cell["pass_at_1"])
            graded = [r for r in want.values() if r["status"] != "infra_error"]
            reward = log.results.scores[1]
            assert reward.name == "reward" and reward.metrics["mean"].value == pytest.approx(
                sum(r["reward"] for r in graded) / len(graded))
            # a log per (checkpoint, harness) in Inspect View's eyes: no two share a task_id
            task_ids.append(log.eval.task_id)
            assert log.eval.model == f"harnessrl/{cfg.policy.model}@{ck['name']}"
    assert len(set(task_ids)) == len(task_ids) == len(plan["checkpoints"]) * len(plan["harnesses"])
    assert any(r["retry"] for r in rows)  # the fixture has retried infra errors: replaced rows are not samples
    assert check_inspect_logs(store.url) == []


def test_inspect_logs_time_each_turn_by_its_engine_call(tmp_path):
    """The runner's ``turn_times`` (the engine call that sampled each turn) become the model
    events' timestamps, each request's share of the call as its duration (the batch's wall time and
    size beside it), the samples' spans and working times and the log's; no artifact holds them."""
    from datetime import datetime

    from inspect_ai.log import read_eval_log

    base = ScriptedRunner(p_resolve={"direct": 0.5, "react-python": 0.3}, seed=1, turns=2, context_tokens=64)
    times: dict[str, list] = {}

    def timed(*args, **kw):
        for eps, turns in base(*args, **kw):
            for i, e in enumerate(eps):
                t = 1.7e9 + 10.0 * len(times)  # 1 s and 2 s calls, a 3 s tool step between
                e["turn_times"] = times[e["episode_id"]] = [[t, t + 1.0, 8.0], [t + 4.0, t + 6.0, 8.0]]
            yield eps, turns

    _, store, _, out, *_ = _run(tmp_path, runner=timed)
    _, plain, _, out2, *_ = _run(tmp_path / "plain", runner=base)
    for k in out:  # the times are in no artifact
        assert out[k].sha256 == out2[k].sha256, k
    rows = store.rows(out["evaluations"])
    timed_logs = 0
    for rel in store.list_files("evaluate/inspect"):
        log = read_eval_log(f"{store.root}/{rel}")
        for s in log.samples:
            want = times[s.metadata["eval_id"]]
            assert [e.timestamp.timestamp() for e in s.events] == [w[0] for w in want]
            assert [e.completed.timestamp() for e in s.events] == [w[1] for w in want]
            # a call of 1 s and one of 2 s, each batching 8 requests: this request's share
            assert [e.working_time for e in s.events] == [e.output.time for e in s.events] == [1.0 / 8, 2.0 / 8]
            assert [e.working_start for e in s.events] == [0.0, 4.0]
            assert [e.metadata["batch_requests"] for e in s.events] == [8, 8]
            assert [e.metadata["batch_wall_s"] for e in s.events] == [1.0, 2.0]
            assert datetime.fromisoformat(s.started_at).timestamp() == want[0][0]
            assert s.working_time == s.total_time == pytest.approx(3.0 / 8) and "share" in s.metadata["timing"]
            assert datetime.fromisoformat(s.completed_at).timestamp() == want[1][1]  # the window: 6 s
        assert log.stats.started_at == min(s.started_at for s in log.samples)
        timed_logs += 1
    assert timed_logs == 4 and len(times) == len(rows)
    # without times (the plain runner) the events carry no duration
    log = read_eval_log(f"{plain.root}/{plain.list_files('evaluate/inspect')[0]}")
    assert all(e.working_time is None for s in log.samples for e in s.events)
    assert all(s.total_time is None for s in log.samples)


def test_inspect_model_name_of_a_model_path():
    from tasks.evaluate.inspect_log import model_name

    assert model_name("/tmp/models/tiny-llama/", "base") == "harnessrl/tiny-llama@base"
    assert model_name("smollm2-135m-instruct", "step-15") == "harnessrl/smollm2-135m-instruct@step-15"


def test_a_pool_of_export_processes_writes_the_logs_this_process_writes(sealed, tmp_path):
    """The stage wrote the fixture's logs in-process (few samples); the same inputs through two
    spawned worker processes give the same logs, sample for sample, in the same files."""
    from inspect_ai.log import read_eval_log

    from tasks.evaluate.inspect_log import write_inspect_logs
    from tasks.harnesses.frozen import harness_specs

    cfg, store, refs, out, _, tasks, _ = sealed
    plan = store.read_json(PLAN)
    ph = store.read_bytes("evaluate/plan.sha256").decode().strip()
    systems = {s.name: s.render_system() for s in harness_specs(store, refs["harnesses"]).values()}
    pooled = ArtifactStore(tmp_path / "pooled")
    paths = write_inspect_logs(pooled, cfg.name, plan, ph, store.rows(out["evaluations"]), store.rows(out["eval_cells"]),
                               store.rows(out["eval_turns"]), {t["task_id"]: t for t in tasks}, systems, workers=2)
    assert sorted(paths) == sorted(store.list_files("evaluate/inspect")) and len(paths) == 4

    def content(root, rel):
        log = read_eval_log(f"{root}/{rel}")
        spec = log.eval.model_dump(exclude={"created"})
        return spec, [(s.id, s.epoch, [(m.id, m.role, m.text) for m in s.messages], s.metadata,
                       s.scores and {k: v.value for k, v in s.scores.items()}) for s in log.samples]

    for rel in paths:
        assert content(pooled.root, rel) == content(store.root, rel), rel


def test_check_inspect_logs_names_a_forged_sample(sealed, tmp_path):
    from inspect_ai.log import read_eval_log, write_eval_log

    from tasks.evaluate.exports import check_inspect_logs

    _, store, *_ = sealed
    run = tmp_path / "run"
    shutil.copytree(store.root, run)
    path = run / "evaluate/inspect/final.direct.eval"
    log = read_eval_log(str(path))
    s = next(s for s in log.samples if s.scores and s.scores["resolved"].value == "I")
    s.scores["resolved"].value = "C"  # a failure turned into a pass
    dropped = next(x for x in reversed(log.samples) if x is not s)  # and a sample deleted
    log.samples.remove(dropped)
    write_eval_log(log, str(path))
    probs = check_inspect_logs(str(run))
    assert any(f"sample {s.id} epoch {s.epoch}: resolved = 'C'" in p for p in probs), probs
    assert any(f"no sample for task {dropped.id} epoch {dropped.epoch}" in p for p in probs), probs
    (run / "evaluate/inspect/base.react-python.eval").unlink()
    assert any("base.react-python.eval: missing" in p for p in check_inspect_logs(str(run)))
    result = CliRunner().invoke(app, ["verify", str(run)])
    assert result.exit_code == 1 and "Inspect logs" in result.output


def _timeless(sample):
    """A sample's fields but its model events' timestamps (the time of writing, as the log's own)."""
    d = sample.model_dump()
    for e in d["events"]:
        e.pop("timestamp")
    return d


def test_reruns_are_byte_identical(sealed, tmp_path):
    _, store, _, out, *_ = sealed
    _, store2, _, out2, *_ = _run(tmp_path)
    for k in out:
        assert out[k].sha256 == out2[k].sha256, k
    # the Inspect logs carry the time of writing; every sealed value in them is the same
    from inspect_ai.log import read_eval_log

    for rel in store.list_files("evaluate/inspect"):
        a, b = (read_eval_log(f"{st.root}/{rel}") for st in (store, store2))
        assert [_timeless(x) for x in a.samples] == [_timeless(x) for x in b.samples]
        assert a.eval.metadata == b.eval.metadata and a.results == b.results


def test_evaluate_refuses_test_tasks_in_the_train_records(tmp_path):
    cfg = _cfg()
    store, refs, tasks, records = _store(tmp_path, cfg)
    test_task = next(t for t in tasks if t["split"] == "test")
    bad = [dict(r, split="train") if r["task_id"] == test_task["task_id"] else r for r in records]
    refs["records"] = store.write("freeze", "records", bad)
    with pytest.raises(LeakageError, match=f"1 test-split task.*train records: \\['{test_task['task_id']}'\\]"):
        run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner())
    assert not store.exists(PLAN)


def test_evaluate_refuses_test_tasks_in_online_training_rollouts(tmp_path):
    cfg = _cfg()
    store, refs, tasks, records = _store(tmp_path, cfg)
    rec = next(r for r in records if r["split"] == "test")
    refs["online_episodes"] = store.write("train", "online_episodes", [_episode(rec, version=1)], contract="episodes")
    with pytest.raises(LeakageError, match=f"training rollouts: \\['{rec['task_id']}'\\]"):
        run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner())
    assert not store.exists(PLAN)


def test_a_contrast_naming_an_unknown_checkpoint_is_refused(tmp_path):
    con = [{"name": "x", "a": {"checkpoint": "step-9", "harness": "direct"},
            "b": {"checkpoint": "base", "harness": "direct"}}]
    with pytest.raises(ValueError, match="contrasts\\['x'\\].a.checkpoint='step-9' is not a checkpoint of this run"):
        _cfg(contrasts=con)
    # a config whose checkpoints the train stage's artifact lacks (an arm it never wrote) is refused before the plan
    con[0]["a"]["checkpoint"] = "k3"
    cfg = RunConfig.model_validate({**_cfg().model_dump(mode="json"), "arms": [{"name": "k3"}],
                                    "evaluate": {**_cfg().evaluate.model_dump(mode="json"), "contrasts": con}})
    store, refs, *_ = _store(tmp_path, cfg)
    with pytest.raises(ValueError, match="contrasts\\['x'\\].a.checkpoint='k3' is not a checkpoint of this run "
                                         "\\['base', 'final'\\]"):
        run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner())
    assert not store.exists(PLAN)


def test_config_refuses_a_contrast_on_a_harness_not_evaluated():
    with pytest.raises(ValueError, match="contrasts\\['x'\\].b.harness='web-react'"):
        _cfg(contrasts=[{"name": "x", "a": {"checkpoint": "final", "harness": "direct"},
                         "b": {"checkpoint": "base", "harness": "web-react"}}])


# ---- tampering: `harnessrl verify RUN_DIR` names the first broken row -----------------------------

def _rewrite(path, fn):
    t = pq.read_table(path)
    rows = t.to_pylist()
    fn(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), path)


def _flip(rows):
    rows[7]["reward"] = 1.0 - rows[7]["reward"]


def _retry_orig(rows):  # turn a retry's original into a resolved attempt: its retry no longer refers to an infra error
    i = next(r["seq"] for r in rows if r["retry"] == 1)
    orig = next(r for r in rows if r["eval_id"] == rows[i]["retry_of"])
    orig["status"] = "resolved"


TAMPER = {
    "flipped reward": (lambda rd: _rewrite(rd / "evaluate/evaluations.parquet", _flip), "row 7 .*value was changed"),
    "dropped row": (lambda rd: _rewrite(rd / "evaluate/evaluations.parquet", lambda r: r.pop(5)), "row 5 .*seq"),
    "added row": (lambda rd: _rewrite(rd / "evaluate/evaluations.parquet", lambda r: r.insert(3, dict(r[3]))),
                  "row 4 .*seq"),
    "reordered rows": (lambda rd: _rewrite(rd / "evaluate/evaluations.parquet",
                                           lambda r: r.__setitem__(slice(10, 12), [r[11], r[10]])), "row 10"),
    "edited retry original": (lambda rd: _rewrite(rd / "evaluate/evaluations.parquet", _retry_orig),
                              "value was changed"),
    "edited statistics": (lambda rd: _rewrite(rd / "evaluate/eval_cells.parquet",
                                               lambda r: r[0].update(graded=r[0]["graded"] + 1)),
                          "eval_cells.parquet row 0: graded="),
    "swapped checkpoint": (lambda rd: (rd / "train/checkpoints/step-2/adapter_model.safetensors").write_bytes(b"other"),
                           "checkpoint 'final'"),
    "edited plan": (lambda rd: (rd / PLAN).write_text((rd / PLAN).read_text().replace('"attempts": 3', '"attempts": 2')),
                    "plan: hash"),
    "edited committed plan hash": (lambda rd: (rd / "evaluate/plan.sha256").write_text("0" * 64 + "\n"), "plan: hash"),
    # every artifact the evaluation writes is required (issue 20, item 3)
    "deleted statistics": (lambda rd: (rd / "evaluate/eval_contrasts.parquet").unlink(),
                           "eval_contrasts.parquet: missing"),
    "deleted export": (lambda rd: next((rd / "evaluate/exports/swebench").glob("*.final.direct.attempt1.report.json"))
                       .unlink(), r"final\.direct\.attempt1\.report\.json: missing"),
    "edited export": (lambda rd: [p.write_text(p.read_text().replace('"resolved_instances": ', '"resolved_instances": 1'))
                                  for p in (rd / "evaluate/exports/swebench").glob("*.report.json")],
                      "report.json: differs from the file recomputed"),
    "added export": (lambda rd: (rd / "evaluate/exports/swebench/x.report.json").write_text("{}"),
                     "x.report.json: not a file the evaluation writes"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_verify_cli_names_every_tampering(sealed, tmp_path, case):
    _, store, *_ = sealed
    rd = tmp_path / "copy"
    shutil.copytree(store.root, rd)
    cli = CliRunner()
    ok = cli.invoke(app, ["verify", str(rd)])
    assert ok.exit_code == 0, ok.output
    tamper, match = TAMPER[case]
    tamper(rd)
    bad = cli.invoke(app, ["verify", str(rd)])
    assert bad.exit_code == 1, bad.output
    import re
    assert re.search(match, bad.output.replace("\n", " ")), bad.output
    with pytest.raises(SealError):
        verify_run(ArtifactStore(rd))


@pytest.mark.parametrize("case,setup,match", [
    ("empty folder", lambda rd: None, "evaluate/plan.json is missing"),
    ("no such folder", lambda rd: rd.rmdir(), "no such folder"),
    ("plan not JSON", lambda rd: (rd / "evaluate").mkdir() or [(rd / p).write_text("{x") for p in
                                                                ("evaluate/plan.json", "evaluate/plan.sha256",
                                                                 "evaluate/evaluations.parquet")], "plan.json: unreadable"),
])
def test_verify_exit_2_for_a_folder_that_is_not_a_run(tmp_path, case, setup, match):
    rd = tmp_path / "notarun"
    rd.mkdir()
    setup(rd)
    r = CliRunner().invoke(app, ["verify", str(rd)])
    assert r.exit_code == 2, r.output
    assert "NOT A RUN" in r.output and match in r.output.replace("\n", " ") and "VERIFY FAILED" not in r.output


def test_verify_exit_2_for_unreadable_rows(sealed, tmp_path):
    _, store, *_ = sealed
    rd = tmp_path / "copy"
    shutil.copytree(store.root, rd)
    (rd / "evaluate/evaluations.parquet").write_bytes(b"not parquet")
    r = CliRunner().invoke(app, ["verify", str(rd)])
    assert r.exit_code == 2 and "evaluations.parquet cannot be read as Parquet" in r.output, r.output


def test_eval_turns_are_streamed_chunk_by_chunk(tmp_path, monkeypatch):
    """Each chunk's turns are written before the runner makes the next chunk (the stage never holds
    all turns), and eval_turns holds every turn of every sealed attempt, retries included."""
    from schemas.store import ArtifactStream
    from tasks.rollout.turns import by_episode, prompt_lengths

    events = []

    class Logged(ScriptedRunner):
        def _chunk(self, *a):
            out = super()._chunk(*a)
            events.append(("made", len(out[1])))
            return out

    add = ArtifactStream.add
    monkeypatch.setattr(ArtifactStream, "add", lambda self, rows: (events.append(("written", len(rows))),
                                                                   add(self, rows))[1])
    runner = Logged(p_resolve={"direct": 0.5}, infra_rate=0.1, seed=1, turns=3, context_tokens=100, chunk_records=4)
    _, store, _, out, *_ = _run(tmp_path, _cfg(infra_retries=1), runner)
    assert len(events) > 10 and events[0::2] == [("made", n) for _, n in events[1::2]]
    assert {e[0] for e in events[1::2]} == {"written"}
    rows = store.rows(out["evaluations"])
    turns = by_episode(store.rows(out["eval_turns"]))
    assert set(turns) == {r["eval_id"] for r in rows} and any(r["retry"] for r in rows)
    assert all(len(ts) == 3 and prompt_lengths(ts)[-1] + len(ts[-1]["completion_token_ids"]) == 100
               for ts in turns.values())


def test_turns_of_an_unsealed_episode_are_refused(tmp_path):
    class Stray(ScriptedRunner):
        def _chunk(self, *a):
            eps, turns = super()._chunk(*a)
            first, self.stray_done = not getattr(self, "stray_done", False), True
            return eps, turns + ([dict(turns[0], episode_id="not-an-attempt")] if first else [])

    with pytest.raises(ValueError, match="no sealed attempt, e.g. not-an-attempt"):
        _run(tmp_path, _cfg(), Stray(seed=1))
    assert not (tmp_path / "run/evaluate/eval_turns.parquet").exists()
    assert not list((tmp_path / "run/evaluate").glob(".tmp-*"))


def test_an_evaluation_whose_runner_returns_no_episode_fails_in_one_line_and_writes_nothing(tmp_path):
    def nothing(*_a, **_kw):  # a runner that ran no attempt (all shards lost, say)
        return iter(())

    cfg = _cfg()
    store, refs, *_ = _store(tmp_path, cfg)
    before = {k: store.manifest(v.stage, v.name)["sha256"] for k, v in refs.items()}
    with pytest.raises(ArtifactError) as e:
        run_evaluate(store, cfg, refs, episode_runner=nothing)
    msg = str(e.value)
    assert msg.startswith("[evaluate/evaluations] evaluations: 0 rows (no attempt ran: ") and "\n" not in msg, msg
    ev = tmp_path / "run/evaluate"
    assert not (ev / "evaluations.parquet").exists() and not (ev / "eval_turns.parquet").exists()
    assert not list(ev.glob(".tmp-*"))
    assert {k: store.manifest(v.stage, v.name)["sha256"] for k, v in refs.items()} == before
