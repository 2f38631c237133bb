"""TalkMesh as a harness family (`loop_type: talkmesh`) in the normal pipeline: spec validation,
unchanged harness ids, and a tiny freeze -> rollout -> train -> evaluate -> analyze run on the
tiny model (engine hf) with the stage functions wired as flows/stages.py wires them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from schemas import ArtifactStore
from tasks.harnesses.spec import HarnessError, HarnessSpec, load_harness

# direct's id before the mesh field existed (a spec without `mesh` must hash as it did)
DIRECT_ID = "350a31e3fe907a275c85d1174ea108c8d4855a0c1ace7fa5931fead287c41202"
SHIPPED = Path(__file__).resolve().parents[2] / "tasks" / "harnesses" / "specs"  # not the tiny_specs patch


def _spec_dict(**over):
    d = yaml.safe_load(open(SHIPPED / "talkmesh.yaml"))
    d.update(over)
    return d


def _write(tmp_path, d, name="bad.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


def test_spec_validation_names_file_key_and_value(tmp_path):
    tm = load_harness(SHIPPED / "talkmesh.yaml")
    assert tm.loop_type == "talkmesh" and tm.mesh is not None and tm.mesh.agents == 4
    with pytest.raises(HarnessError, match=r"bad\.yaml.*loop_type talkmesh needs a mesh"):
        load_harness(_write(tmp_path, {k: v for k, v in _spec_dict().items() if k != "mesh"}))
    with pytest.raises(HarnessError, match=r"needs environments: \[answer\], not \['workspace'\]"):
        load_harness(_write(tmp_path, _spec_dict(environments=["workspace"])))
    direct = yaml.safe_load(open(SHIPPED / "direct.yaml"))
    with pytest.raises(HarnessError, match="mesh section is only for loop_type talkmesh, not loop_type single_turn"):
        load_harness(_write(tmp_path, {**direct, "mesh": {"agents": 3}}))
    with pytest.raises(HarnessError, match=r"mesh\.agents"):
        load_harness(_write(tmp_path, _spec_dict(mesh={"agents": 1})))
    with pytest.raises(HarnessError, match=r"mesh\.degree=3 with mesh\.agents=5"):
        load_harness(_write(tmp_path, _spec_dict(mesh={"agents": 5, "topology": "regular", "degree": 3})))
    with pytest.raises(HarnessError, match="loop_type talkmesh takes no skill"):
        load_harness(_write(tmp_path, _spec_dict(skill="Check twice.")))
    with pytest.raises(HarnessError, match="bogus"):
        load_harness(_write(tmp_path, _spec_dict(mesh={"agents": 3, "bogus": 1})))


def test_harness_ids_unchanged_and_mesh_hashed():
    d = load_harness(SHIPPED / "direct.yaml")
    assert d.harness_id == DIRECT_ID and "mesh" not in json.loads(d.to_row()["spec_json"])
    tm = load_harness(SHIPPED / "talkmesh.yaml")
    other = HarnessSpec.model_validate({**tm.spec_dict(), "mesh": {**tm.spec_dict()["mesh"], "agents": 5}})
    assert other.harness_id != tm.harness_id
    assert HarnessSpec.model_validate(json.loads(tm.to_row()["spec_json"])).harness_id == tm.harness_id


def test_engine_refuses_a_talkmesh_spec():
    from tasks.config import SandboxConfig
    from tasks.rollout.harness import run_episodes

    with pytest.raises(ValueError, match="loop_type talkmesh is not run by the harness engine"):
        run_episodes(object(), load_harness(SHIPPED / "talkmesh.yaml"), [], SandboxConfig(), seed=0)


TINY = {"agents": 3, "threshold": 1.0, "head_samples": 2, "head": {"steps": 10},
        "talk_sampling": {"temperature": 1.0, "max_new_tokens": 8}, "max_solution_chars": 60}


@pytest.fixture(scope="module")
def tiny_specs(tmp_path_factory):
    """A spec folder with a small `talkmesh` (3 agents, every one below threshold 1.0 revises)."""
    import tasks.harnesses.spec as spec_mod

    d = tmp_path_factory.mktemp("specs")
    (d / "talkmesh.yaml").write_text(yaml.safe_dump(_spec_dict(
        mesh=TINY, sampling={"temperature": 1.0, "max_new_tokens": 8})))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec_mod, "SPEC_DIR", d)
        yield d


def _cfg(model_dir, **over):
    from tasks.config import RunConfig

    d = {"name": "tm-pipe", "seed": 3,
         "suites": [{"name": "basic_arithmetic", "size": 5, "seed": 1,
                     "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
         "split": {"test_fraction": 0.4}, "harnesses": ["talkmesh"],
         "policy": {"model": str(model_dir), "autocast_dtype": "float32", "rollout_dtype": "float32"},
         "rollout": {"samples_per_task": 1, "task_runner": "serial"},
         "train": {"micro_batch_size": 32, "lr": 0.01, "kl": {"beta": 0.0}},
         "evaluate": {"attempts": 1, "bootstrap_resamples": 100},
         "analyze": {"ceiling_k": 1, "bootstrap_resamples": 100, "kl_check": False}}
    d.update(over)
    return RunConfig.model_validate(d)


def _five_stages(store, cfg):
    """The stages with the inputs flows/stages.py gives them."""
    from tasks.analysis.stage import run_analyze
    from tasks.evaluate.stage import run_evaluate
    from tasks.records.stage import run_freeze
    from tasks.rollout.stage import run_rollout
    from tasks.train.stage import run_train

    fr = run_freeze(store, cfg, {})
    ro = run_rollout(store, cfg, fr)
    tr = run_train(store, cfg, {"tasks": fr["tasks"], "harnesses": fr["harnesses"], "records": fr["records"], **ro})
    ev_in = {**fr, "episodes": ro["episodes"], "checkpoints": tr["checkpoints"], "talkmesh_head": ro["talkmesh_head"]}
    ev = run_evaluate(store, cfg, ev_in)
    an = run_analyze(store, cfg, {"tasks": fr["tasks"], "harnesses": fr["harnesses"], "episodes": ro["episodes"],
                                  "turns": ro["turns"], "train_steps": tr["train_steps"],
                                  "checkpoints": tr["checkpoints"], **ev, "talkmesh_head": ro["talkmesh_head"]})
    return fr, ro, tr, ev, an


@pytest.fixture(scope="module")
def run(tiny_model_dir, tiny_specs, tmp_path_factory):
    cfg = _cfg(tiny_model_dir)
    root = tmp_path_factory.mktemp("tm-run")
    store = ArtifactStore(root / "run")
    return cfg, root, store, _five_stages(store, cfg)


def test_rollout_episodes_are_mesh_runs(run):
    from tasks.records.verifiers import score
    from tasks.train.sequences import SequenceError, build_sequences

    cfg, root, store, (fr, ro, tr, ev, an) = run
    tasks = {t["task_id"]: t for t in store.rows(fr["tasks"])}
    n_train = sum(t["split"] == "train" for t in tasks.values())
    # one mesh run per episode; reward = the consensus answer graded; turns = messages written
    eps, turns = store.rows(ro["episodes"]), store.rows(ro["turns"])
    assert len(eps) == n_train and {e["harness_name"] for e in eps} == {"talkmesh"}
    by_ep = {}
    for t in turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    for e in eps:
        t = tasks[e["task_id"]]
        want = e["final_answer"] is not None and score(t["verifier_kind"], t["verifier_spec"], e["final_answer"]) >= 1.0
        assert e["reward"] == (1.0 if want else 0.0) and e["success"] == want
        ts = by_ep[e["episode_id"]]
        acts = [json.loads(x["action"]) for x in ts]
        # 3 proposals, one hint (full topology: one global source), 2 revisions (threshold 1.0)
        assert e["num_turns"] == len(ts) == 6
        assert [a["kind"] for a in acts] == ["proposal"] * 3 + ["hint"] + ["revision"] * 2
        assert e["output_tokens"] == sum(len(x["completion_token_ids"]) for x in ts)
        for a in acts:
            if a["kind"] == "revision":
                assert a["talk_reward"] == float(a["correct"]) - float(a["proposal_correct"])
                assert acts[a["hint_turn"]]["kind"] == "hint"
        assert acts[3]["talk_reward"] == pytest.approx(sum(a["talk_reward"] for a in acts[4:]) / 2)
    head = store.rows(ro["talkmesh_head"])
    assert len(head) == 1 and head[0]["n"] <= n_train * 2 and 0.0 <= head[0]["ece"] <= 1.0
    calib = store.rows(ro["talkmesh_calibration_talkmesh"], contract="talkmesh_calibration")
    assert sum(c["n"] for c in calib) == head[0]["n"] and calib[0]["ece"] == head[0]["ece"]
    # talkmesh turns are separate messages: the episode sequence builder refuses them
    with pytest.raises(SequenceError, match="is a talkmesh run: its turns are separate messages"):
        build_sequences(eps, turns, {e["harness_id"]: (1.0, 0, 1.0) for e in eps})


def test_train_uses_talk_sequences_and_online_is_refused(run, tiny_model_dir):
    from tasks.train.stage import run_train

    cfg, root, store, (fr, ro, tr, ev, an) = run
    talk = store.rows(tr["talkmesh_talk_sequences"])
    revs = [r for r in talk if r["kind"] == "revision"]
    assert len(revs) == 2 * ro["episodes"].rows and {r["reward"] for r in revs} <= {-1.0, 0.0, 1.0}
    assert {r["kind"] for r in talk} == {"hint", "revision"}
    assert [s["step"] for s in store.rows(tr["train_steps"])] == [1]
    online = _cfg(tiny_model_dir, train={"steps": 1, "mode": "online", "kl": {"beta": 0.0}})
    with pytest.raises(ValueError, match="not supported with a talkmesh harness"):
        run_train(store, online, {"tasks": fr["tasks"], "harnesses": fr["harnesses"], "records": fr["records"], **ro})


def test_sealed_evaluation_and_report(run):
    from tasks.evaluate.seal import SealError
    from tasks.evaluate.verify import verify_run

    cfg, root, store, (fr, ro, tr, ev, an) = run
    plan = json.loads((root / "run/evaluate/plan.json").read_text())
    assert plan["loop_states"]["talkmesh_head"]["sha256"] == ro["talkmesh_head"].sha256 == plan["inputs"]["talkmesh_head"]
    evals = store.rows(ev["evaluations"])
    assert {e["checkpoint"] for e in evals} == {"base", "final"} and all(e["num_turns"] == 6 for e in evals)
    eval_turns = store.rows(ev["eval_turns"], contract="turns")
    assert len(eval_turns) == 6 * len(evals)
    report = (root / "run/analyze/report.md").read_text()
    assert "## TalkMesh (P3)" in report and "left out of per-step branching" in report
    assert "| talkmesh | base |" in report and "| talkmesh | final |" in report
    verify_run(store)
    p = root / "run" / ro["talkmesh_head"].path
    good = p.read_bytes()
    p.write_bytes(good + b"\0")
    try:
        with pytest.raises(SealError, match="talkmesh_head the attempts ran with changed"):
            verify_run(store)
    finally:
        p.write_bytes(good)


def test_rerun_gives_identical_rollout(run):
    from tasks.records.stage import run_freeze
    from tasks.rollout.stage import run_rollout

    cfg, root, store, (fr, ro, tr, ev, an) = run
    store2 = ArtifactStore(root / "run2")
    ro2 = run_rollout(store2, cfg, run_freeze(store2, cfg, {}))
    assert {k: v.sha256 for k, v in ro2.items()} == {k: v.sha256 for k, v in ro.items()}


def test_shipped_pipeline_config_loads():
    from tasks.config import load_config

    cfg = load_config("configs/talkmesh-pipeline.yaml")
    assert cfg.harnesses == ["talkmesh"] and cfg.policy.engine == "vllm" and cfg.train.mode == "frozen"
    assert cfg.suites[0].name == "gsm_symbolic" and cfg.evaluate.attempts == 2
