"""Training arms (docs/methods/p4-within-cross.md, docs/methods/p5-kl.md): config merge and
validation, several adapters from one set of rollouts on the tiny model, per-arm resume after a
crash, and the default contrasts."""

import json
from pathlib import Path

import pytest
import torch

import tasks.train.loops as loops_mod
import tasks.train.trainer as trainer_mod
from schemas import ArtifactStore
from tasks.config import ConfigError, RunConfig, load_config
from tasks.evaluate.prereg import default_contrasts
from tasks.hashing import sha256_dir
from tasks.records.freeze import freeze_tables
from tasks.train.stage import run_train

BASE = {"name": "arms", "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 2}],
        "split": {"test_fraction": 0.34}, "harnesses": ["direct", "react-python"]}


def _cfg(**over):
    return RunConfig.model_validate({**BASE, **over})


# ---- config -------------------------------------------------------------------------------------

def test_without_arms_there_is_one_final_arm_and_hashes_do_not_change():
    c = _cfg(train={"epochs": 3})
    assert c.arm_configs() == [("final", c.train)] and c.checkpoint_names() == ["base", "final"]
    # an absent optional section (arms, sweep, quick) is left out of the hash, so adding "arms" to
    # the train stage's sections keeps the cache keys of configs without arms
    assert c.section_hash("policy", "train", "arms", "sweep") == c.section_hash("policy", "train")
    from tasks.hashing import sha256_json

    dump = c.model_dump(mode="json")
    assert dump["train"].pop("distributed") is None  # train.distributed, absent, is left out the same way
    assert [dump.pop(k) for k in ("arms", "sweep", "quick")] == [None] * 3 and c.config_hash() == sha256_json(dump)
    with_arms = _cfg(train={"epochs": 3}, arms=[{"name": "a"}])
    assert with_arms.section_hash("policy", "train", "arms") != with_arms.section_hash("policy", "train")


def test_arm_overrides_deep_merge_onto_train():
    c = _cfg(train={"epochs": 3, "lr": 0.01, "kl": {"beta": 0.1, "placement": "loss"}, "lora": {"r": 4}},
             arms=[{"name": "within"}, {"name": "cross", "train": {"grouping": "cross", "lora": {"target_modules": ["q_proj"]}}},
                   {"name": "k3", "train": {"kl": {"estimator": "k3"}}}])
    arms = dict(c.arm_configs())
    assert list(arms) == ["within", "cross", "k3"] and c.checkpoint_names() == ["base", "within", "cross", "k3"]
    assert arms["within"] == c.train
    assert arms["cross"].grouping == "cross" and arms["cross"].lora.r == 4 and arms["cross"].lora.target_modules == ["q_proj"]
    assert arms["k3"].kl.estimator == "k3" and arms["k3"].kl.beta == 0.1 and arms["k3"].kl.placement == "loss"
    assert arms["k3"].lr == 0.01 and arms["k3"].grouping == "within"
    assert c.train.kl.estimator == "k1"  # the top-level section is unchanged


@pytest.mark.parametrize("arms, message", [
    ([{"name": "a", "train": {"stpes": 3}}], r"arms\['a'\].train.stpes=3: Extra inputs are not permitted"),
    ([{"name": "a", "train": {"kl": {"estimator": "k9"}}}], r"arms\['a'\].train.kl.estimator='k9'"),
    ([{"name": "a", "train": {"algorithm": "gspo"}}], r"arms\['a'\].train: .*not defined for GSPO"),
    ([{"name": "a"}, {"name": "b"}, {"name": "a"}], r"duplicate arm name\(s\) \['a'\]"),
    ([{"name": "base"}], r"arms\[\].name='base' is reserved"),
    ([{"name": "x/y"}], r"arms.0.name"),
    ([], r"arms"),
    ([{"name": "a", "nope": 1}], r"arms.0.nope"),
    ([{"name": "a", "train": {"harnesses": ["answer-tag"]}}],
     r"arms\['a'\].train.harnesses=\['answer-tag'\]: must be a non-empty subset of the training harnesses"),
    ([{"name": "a", "train": {"harnesses": []}}], r"arms\['a'\].train.harnesses=\[\]"),
])
def test_bad_arms_are_refused_at_load(arms, message):
    with pytest.raises(ValueError, match=message):
        _cfg(arms=arms)


def test_run_level_train_checks_hold_for_every_arm():
    with pytest.raises(ValueError, match=r"arms\['on'\].train.mode='online'"):
        _cfg(rollout={"task_runner": "dask"}, arms=[{"name": "off"},
                                                    {"name": "on", "train": {"mode": "online", "steps": 2}}])
    _cfg(rollout={"task_runner": "dask"}, arms=[{"name": "off"}])  # frozen arms are fine with dask


def _contrast(a, b="base"):
    return {"contrasts": [{"name": "c", "a": {"checkpoint": a, "harness": "direct"},
                           "b": {"checkpoint": b, "harness": "direct"}}]}


def test_contrast_checkpoints_must_be_base_or_an_arm():
    _cfg(evaluate=_contrast("final"))
    _cfg(arms=[{"name": "w"}, {"name": "x"}], evaluate=_contrast("w", "x"))
    with pytest.raises(ValueError, match=r"contrasts\['c'\].a.checkpoint='final' is not a checkpoint of this run "
                                         r"\['base', 'w'\]"):
        _cfg(arms=[{"name": "w"}], evaluate=_contrast("final"))
    with pytest.raises(ValueError, match=r"contrasts\['c'\].b.checkpoint='w'"):
        _cfg(evaluate=_contrast("final", "w"))


def test_yaml_arm_error_names_the_file_and_key(tmp_path):
    import yaml

    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump({**BASE, "arms": [{"name": "k2", "train": {"kl": {"estimator": "k7"}}}]}))
    with pytest.raises(ConfigError, match=r"run.yaml.*arms\['k2'\].train.kl.estimator='k7'"):
        load_config(p)


def test_default_contrasts_with_arms():
    ck = [{"name": n} for n in ("base", "within", "cross")]
    got = default_contrasts(ck, ["direct", "react-python"])
    assert [c["name"] for c in got] == ["within-vs-base:direct", "within-vs-base:react-python",
                                        "cross-vs-base:direct", "cross-vs-base:react-python"]
    assert got[2] == {"name": "cross-vs-base:direct", "a": {"checkpoint": "cross", "harness": "direct"},
                      "b": {"checkpoint": "base", "harness": "direct"}}
    # the single-arm run is as before; no base, no default contrasts
    assert [c["name"] for c in default_contrasts([{"name": "base"}, {"name": "final"}], ["direct"])] == \
        ["final-vs-base:direct"]
    assert default_contrasts([{"name": "final"}], ["direct"]) == []


# ---- the train stage on the tiny model ----------------------------------------------------------

def _arm_cfg(model_dir, arms=True):
    d = {**BASE, "policy": {"model": str(model_dir)},
         "train": {"ppo_epochs": 2, "lr": 0.05, "micro_batch_size": 4, "lora": {"r": 4, "alpha": 8}}}
    if arms:
        d["arms"] = [{"name": "within"}, {"name": "cross", "train": {"grouping": "cross"}}]
    return RunConfig.model_validate(d)


def _store(root, cfg):
    """A run store with the frozen tables and synthetic rollouts: 2 samples per train record; under
    ``direct`` one sample per task succeeds, under ``react-python`` none does, so within-harness and
    cross-harness groups give different advantages."""
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(root)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    g = torch.Generator().manual_seed(0)
    eps, turns = [], []
    for r in (r for r in records if r["split"] == "train"):
        for k in range(2):
            eid = f"{r['record_id'][:12]}-{k}"
            reward = float(r["harness_name"] == "direct" and k == 0)
            eps.append({"episode_id": eid, "record_id": r["record_id"], "task_id": r["task_id"],
                        "task_hash": r["task_hash"], "harness_id": r["harness_id"], "harness_name": r["harness_name"],
                        "split": "train", "policy_id": "p", "policy_version": 0, "group_id": "g", "sample_idx": k,
                        "seed": k, "reward": reward, "success": bool(reward), "status": "ok", "stop_reason": "submitted", "num_turns": 1,
                        "input_tokens": 5, "output_tokens": 4, "final_answer": "1", "answer_parsed": True})
            comp = torch.randint(5, 1000, (4,), generator=g).tolist()
            turns.append({"episode_id": eid, "turn_idx": 0, "prompt_continues": False,
                          "prompt_added_ids": torch.randint(5, 1000, (5,), generator=g).tolist(),
                          "completion_token_ids": comp, "completion_logprobs": [-2.0] * 4, "loss_mask": [1] * 4,
                          "completion_text": "x", "finish_reason": "stop", "action": "{}", "observation": "",
                          "read_spans": "[]"})
    refs["episodes"] = store.write("rollout", "episodes", eps)
    refs["turns"] = store.write("rollout", "turns", turns)
    return store, refs


@pytest.fixture(scope="module")
def two_arms(tiny_model_dir, tmp_path_factory):
    cfg = _arm_cfg(tiny_model_dir)
    store, refs = _store(tmp_path_factory.mktemp("arms"), cfg)
    return cfg, store, refs, run_train(store, cfg, refs)


def test_two_arms_give_two_checkpoints_and_tagged_steps(two_arms):
    cfg, store, refs, out = two_arms
    ck = store.rows(out["checkpoints"])
    assert [c["name"] for c in ck] == ["base", "within", "cross"]
    assert [c["path"] for c in ck] == ["", "train/checkpoints/within/step-2", "train/checkpoints/cross/step-2"]
    assert ck[1]["adapter_sha256"] != ck[2]["adapter_sha256"]
    for c in ck[1:]:
        assert sha256_dir(Path(store.root) / c["path"]) == c["adapter_sha256"]
    steps = store.rows(out["train_steps"])
    assert [(s["arm"], s["step"]) for s in steps] == [("within", 1), ("within", 2), ("cross", 1), ("cross", 2)]
    # the react-python groups have equal rewards: zero advantage within harness, not when pooled
    zero = {s["arm"]: s["zero_adv_frac"] for s in steps if s["step"] == 1}
    assert zero["within"] == pytest.approx(0.5) and zero["cross"] == 0.0
    timing = store.manifest("train", "train_steps")["extra"]["timing"]
    assert [(t["arm"], t["step"]) for t in timing] == [(s["arm"], s["step"]) for s in steps]
    assert (Path(store.root) / "train/state/within/trainer_state.pt").is_file()
    assert (Path(store.root) / "train/state/cross/trainer_state.pt").is_file()


def test_one_arm_run_keeps_the_final_layout_and_matches_the_same_arm(two_arms, tiny_model_dir, tmp_path):
    _, _, _, out = two_arms
    cfg = _arm_cfg(tiny_model_dir, arms=False)
    store, refs = _store(tmp_path, cfg)
    single = run_train(store, cfg, refs)
    ck = store.rows(single["checkpoints"])
    assert [(c["name"], c["path"]) for c in ck] == [("base", ""), ("final", "train/checkpoints/step-2")]
    assert (tmp_path / "train/state/trainer_state.pt").is_file()
    assert {s["arm"] for s in store.rows(single["train_steps"])} == {"final"}
    # the same train section trains the same adapter whether it is the only arm or one of several
    multi = {c["name"]: c["adapter_sha256"] for c in ArtifactStore(two_arms[1].root).rows(out["checkpoints"])}
    assert ck[1]["adapter_sha256"] == multi["within"]


def test_training_seeds_give_one_checkpoint_per_seed_and_seed_0_is_the_run_seeds_arm(two_arms, tiny_model_dir,
                                                                                       tmp_path):
    # the run's seed is 0 (BASE sets none): the arm's training seed 0 draws what the unseeded
    # arm drew, bit for bit; seed 1 draws another adapter initialisation and mini-batch order
    d = _arm_cfg(tiny_model_dir).model_dump(mode="json", exclude_none=True)
    d["arms"] = [{"name": "within", "train": {"seeds": [0, 1]}}]
    cfg = RunConfig.model_validate(d)
    assert cfg.seed == 0
    store, refs = _store(tmp_path, cfg)
    out = run_train(store, cfg, refs)
    ck = store.rows(out["checkpoints"])
    assert [(c["name"], c["path"]) for c in ck] == [("base", ""), ("within@s0", "train/checkpoints/within@s0/step-2"),
                                                   ("within@s1", "train/checkpoints/within@s1/step-2")]
    unseeded = {c["name"]: c["adapter_sha256"] for c in ArtifactStore(two_arms[1].root).rows(two_arms[3]["checkpoints"])}
    assert ck[1]["adapter_sha256"] == unseeded["within"] and ck[2]["adapter_sha256"] != ck[1]["adapter_sha256"]
    assert {s["arm"] for s in store.rows(out["train_steps"])} == {"within@s0", "within@s1"}


def test_a_crash_in_the_second_arm_does_not_retrain_the_first(two_arms, tiny_model_dir, tmp_path, monkeypatch):
    _, full_store, _, full = two_arms
    cfg = _arm_cfg(tiny_model_dir)
    store, refs = _store(tmp_path, cfg)
    real_train = loops_mod.train

    def dies_in_cross(c, *a, **kw):
        if c.train.grouping == "cross":
            kw["stop_after"] = 1
        return real_train(c, *a, **kw)

    monkeypatch.setattr(loops_mod, "train", dies_in_cross)
    with pytest.raises(trainer_mod.TrainingInterrupted, match="stopped after step 1"):
        run_train(store, cfg, refs)
    assert not store.exists("train/checkpoints.parquet")
    monkeypatch.setattr(loops_mod, "train", real_train)

    steps, prepares = [], []
    real_step, real_prepare = trainer_mod.Trainer.step, trainer_mod.Trainer.new_batch

    def step(self, b, idx, **kw):
        steps.append(self.tc.grouping)
        return real_step(self, b, idx, **kw)

    def prepare(self, *a, **kw):
        prepares.append(self.tc.grouping)
        return real_prepare(self, *a, **kw)

    monkeypatch.setattr(trainer_mod.Trainer, "step", step)
    monkeypatch.setattr(trainer_mod.Trainer, "new_batch", prepare)
    out = run_train(store, cfg, refs)
    # the finished arm only loads its state (no log-prob pass, no step); the other resumes at step 2
    assert prepares == ["cross"] and steps == ["cross"]
    assert store.rows(out["checkpoints"]) == full_store.rows(full["checkpoints"])
    # NaN-aware equality (NaN columns: e.g. the sync canary of a frozen run)
    assert json.dumps(store.rows(out["train_steps"])) == json.dumps(full_store.rows(full["train_steps"]))


def test_online_arms_put_the_arm_in_the_policy_id(monkeypatch):
    # episode ids are content hashes that include the policy id: with the arm in it, two online
    # arms sampling the same records at the same version never share an episode id
    import tasks.rollout.engines.hf as hf_engine
    import tasks.rollout.runner as runner
    from tasks.train.online_sampler import online_sampler

    pids, tags = [], []
    monkeypatch.setattr(hf_engine.HFPolicy, "from_model",
                        classmethod(lambda cls, m, tok, pc, policy_id: pids.append(policy_id)))
    monkeypatch.setattr(runner, "run_records",
                        lambda pol, c, specs, tasks, recs, n, seed, tag: (tags.append(tag), ([], []))[1])

    class Store:
        def rows(self, ref):
            return [{"task_id": "t1", "task_hash": "h1", "split": "train"}] if ref == "r" else []

    class FakeTrainer:
        tokenizer = None
        version = 3

        def inference_model(self, dtype):
            return None

    cfg = _cfg()
    for arm in ("cross", None):
        sample, _release = online_sampler(Store(), cfg, {"tasks": "t", "records": "r"}, {}, {}, "tiny", arm)
        got = sample(FakeTrainer(), 1)
        assert (got.seqs, got.dropped, got.rows) == ([], {}, {"episodes": [], "turns": []})
    assert pids == ["tiny+cross+online-v3", "tiny+online-v3"] and tags == ["online:1", "online:1"]


def test_an_arm_restricted_to_one_harness_trains_on_that_harness_alone(tiny_model_dir, tmp_path):
    # P1's cells: under direct every group has one success and one failure (a signal everywhere),
    # under react-python every reward is 0 (no signal); the two harnesses pooled: half and half
    d = _arm_cfg(tiny_model_dir).model_dump(mode="json")
    d["arms"] = [{"name": "on-direct", "train": {"harnesses": ["direct"]}},
                 {"name": "on-react", "train": {"harnesses": ["react-python"]}}]
    cfg = RunConfig.model_validate(d)
    store, refs = _store(tmp_path, cfg)
    out = run_train(store, cfg, refs)
    zero = {}
    for s in store.rows(out["train_steps"]):
        zero.setdefault(s["arm"], set()).add(s["zero_adv_frac"])
    assert zero == {"on-direct": {0.0}, "on-react": {1.0}}


def test_online_sampling_of_an_arm_restricted_to_one_harness(monkeypatch):
    import tasks.rollout.engines.hf as hf_engine
    import tasks.rollout.runner as runner
    from tasks.train.online_sampler import online_sampler

    seen = []
    monkeypatch.setattr(hf_engine.HFPolicy, "from_model", classmethod(lambda cls, m, tok, pc, policy_id: None))
    monkeypatch.setattr(runner, "run_records",
                        lambda pol, c, specs, tasks, recs, n, seed, tag: (seen.append(recs), ([], []))[1])
    recs = [{"task_id": "t1", "task_hash": "h1", "split": "train", "harness_name": h} for h in ("direct", "react-python")]

    class Store:
        def rows(self, ref):
            return recs if ref == "r" else [{"task_id": "t1", "task_hash": "h1", "split": "train"}]

    class FakeTrainer:
        tokenizer = None
        version = 0

        def inference_model(self, dtype):
            return None

    for only, want in ((["react-python"], ["react-python"]), (None, ["direct", "react-python"])):
        cfg = _cfg(train={"mode": "online", "steps": 1, "harnesses": only})
        sample, _release = online_sampler(Store(), cfg, {"tasks": "t", "records": "r"}, {}, {}, "tiny", None)
        sample(FakeTrainer(), 0)
        assert [r["harness_name"] for r in seen[-1]] == want


def test_cpu_thread_split_gives_each_side_its_own_cores():
    from tasks.train.online import cpu_thread_split

    assert cpu_thread_split(2) == (1, 1)
    assert cpu_thread_split(16) == (8, 8)
    assert cpu_thread_split(3) == (1, 2)
    assert cpu_thread_split(1) == (1, 1)  # one core: both sides keep one thread each, never zero
    assert cpu_thread_split(16, engine_threads=3) == (3, 13)  # policy.torch_threads sets the engine's share
    assert cpu_thread_split(2, engine_threads=4) == (4, 1)
    with pytest.raises(ValueError, match="n_cores must be >= 1, got 0"):
        cpu_thread_split(0)
    with pytest.raises(ValueError, match="engine_threads must be >= 1, got 0"):
        cpu_thread_split(4, engine_threads=0)


@pytest.mark.parametrize("staleness,device,engine", [(2, "cpu", "vllm"), (0, "cpu", "vllm"), (2, "cuda", "vllm"),
                                                     (2, "cpu", "hf")])
def test_an_engine_sampling_beside_the_trainer_on_the_cpu_gets_its_own_threads(monkeypatch, staleness, device, engine):
    """Off-policy on the CPU (max_staleness > 0), the vLLM engine is started with half the cores
    (policy.torch_threads, its OMP_NUM_THREADS) and the trainer keeps the rest until release;
    strictly on-policy (the engine idles while the trainer trains), on CUDA, or with an engine built
    in process (hf: it samples in the trainer's thread, never beside it) nothing changes."""
    import os

    import tasks.rollout.engines as engines
    import tasks.train.online as online_mod
    from tasks.train.online_sampler import online_sampler

    started = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))

    class Sampler:
        def __init__(self, engine, sample, **kw):
            pass

        def close(self):
            pass

    class Engine:
        def close(self):
            pass

    monkeypatch.setattr(online_mod, "EngineSampler", Sampler)
    monkeypatch.setattr(engines, "load_policy", lambda cfg, adapter_dir=None: (started.append(cfg), Engine())[1])

    class Store:
        def rows(self, ref):
            return []

    cfg = _cfg(policy={"engine": engine, "device": device},
               train={"mode": "online", "steps": 1, "max_staleness": staleness})
    before = torch.get_num_threads()
    try:
        _sampler, release = online_sampler(Store(), cfg, {"tasks": "t", "records": "r"}, {}, {}, "tiny", None)
        split = staleness > 0 and device == "cpu" and engine == "vllm"
        assert [c.policy.torch_threads for c in started] == ([3] if split else [None] if engine == "vllm" else [])
        assert torch.get_num_threads() == (3 if split else before) and before != 3
        release()
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
