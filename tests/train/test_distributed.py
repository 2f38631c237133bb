"""Data-parallel training (torch.distributed, gloo on the CPU): whole groups per rank, the global
batch keeping its meaning (2 processes train the 1-process adapter, with the base weights
replicated (DDP) or sharded (FSDP2)), resume under 2 processes (killed after a step, resumed, and
byte-identical to an uninterrupted run), and the config refusing what is not built."""

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tasks.config import RunConfig
from tasks.hashing import sha256_dir
from tasks.train.distributed import DistContext, check_backend, my_share, shard_groups
from tasks.train.batches import plan_groups
from tasks.train.loops import frozen_schedule, train, train_distributed
from tasks.train.trainer import Trainer
from tests.train.test_trainer import _cfg, _fp32, _seqs

LOG = logging.getLogger("harnessrl.test").debug  # pickles (the spawned ranks get it)


# ---- which rank trains which groups ---------------------------------------------------------------

def test_shard_groups_gives_every_group_to_exactly_one_rank_balancing_the_weights():
    # by decreasing weight to the least-loaded rank: 5 -> r0, 4 -> r1, 3 -> r1, 2 -> r0, 1 -> r0 (tie)
    shards = shard_groups([[0], [1], [2], [3], [4]], [5.0, 1.0, 4.0, 2.0, 3.0], 2)
    assert shards == [[0, 1, 3], [2, 4]]
    assert sorted(g for s in shards for g in s) == [0, 1, 2, 3, 4]
    assert shard_groups([[0], [1]], [1.0, 1.0], 3) == [[0], [1], []]  # fewer groups than ranks: one idles
    with pytest.raises(ValueError, match="world_size=0"):
        shard_groups([[0]], [1.0], 0)


def test_my_share_partitions_a_mini_batch_by_whole_groups_in_its_order():
    idx = [6, 7, 0, 1, 2, 9, 3]  # groups a = {6, 7}, b = {0, 1, 2}, c = {9, 3}
    group = {6: "a", 7: "a", 0: "b", 1: "b", 2: "b", 9: "c", 3: "c"}
    parts = [my_share(idx, group.__getitem__, lambda i: 1.0, DistContext(r, 2)) for r in range(2)]
    assert parts == [[0, 1, 2], [6, 7, 9, 3]]  # b (3) -> r0; a (2) -> r1; c (2) -> r1 (load 2 < 3)
    assert my_share(idx, group.__getitem__, lambda i: 1.0, DistContext(0, 1)) == idx  # one process: unchanged


# ---- the config --------------------------------------------------------------------------------------

def test_config_refuses_what_is_not_built_and_keeps_old_hashes(tiny_model_dir):
    plain = _cfg(tiny_model_dir)
    two = _cfg(tiny_model_dir, distributed={"world_size": 2})
    assert plain.train.world_size == 1 and two.train.world_size == 2 and two.train.distributed.backend == "gloo"
    assert plain.train.distributed is None
    # how the stage runs, not what it computes: the train stage's cache key is unchanged
    assert two.section_hash("train") == plain.section_hash("train")
    assert _cfg(tiny_model_dir, distributed={"world_size": 2, "fsdp": True}).train.distributed.fsdp
    with pytest.raises(ValueError, match="fsdp.*world_size=1 process shards nothing"):
        _cfg(tiny_model_dir, distributed={"world_size": 1, "fsdp": True})
    with pytest.raises(ValueError, match="nccl.*needs CUDA"):
        _cfg(tiny_model_dir, distributed={"world_size": 2, "backend": "nccl"})
    with pytest.raises(ValueError, match="world_size"):
        _cfg(tiny_model_dir, distributed={"world_size": 0})
    with pytest.raises(ValueError, match="distributed online training is not built"):
        _cfg(tiny_model_dir, mode="online", steps=2, distributed={"world_size": 2})


def test_config_hash_of_a_config_without_distributed_is_the_one_before_it_existed(tiny_model_dir):
    cfg = _cfg(tiny_model_dir)
    dump = cfg.model_dump(mode="json")
    dump["train"].pop("distributed")
    from tasks.config import OPTIONAL_SECTIONS
    from tasks.hashing import sha256_json

    assert cfg.config_hash() == sha256_json({k: v for k, v in dump.items()
                                             if not (k in OPTIONAL_SECTIONS and v is None)})
    assert _cfg(tiny_model_dir, distributed={"world_size": 2}).config_hash() != cfg.config_hash()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_nccl_without_cuda_is_refused_in_one_line():
    with pytest.raises(RuntimeError, match="nccl' needs CUDA") as e:
        check_backend("nccl", 2)
    assert "\n" not in str(e.value)


# ---- two processes train the one-process adapter ----------------------------------------------------

def _kw():
    # fp32 (bf16 rounding depends on the batch shapes), 2 groups per step; micro-batches of 2 so
    # that each rank accumulates over several (DDP's no_sync) before its all-reduce. The 1e-5 bound
    # is the float-rounding spread of the trainer itself: in one process, micro-batches of 1 or 3
    # instead of 2 (another summation order) move this adapter by 6.5e-6 and 7.9e-6; 2 processes
    # move it by 7.0e-6 (AdamW turns rounding in gradients that nearly cancel into lr-sized moves)
    return dict(epochs=1, batch_size=2, micro_batch_size=2, lr=0.002)


def _data():
    # 3 groups of 3: step 1 trains 2 groups (one per rank), step 2 the last group, so that one rank
    # has nothing of its own and joins the all-reduce with a zero gradient
    return _seqs(n=9, group=3)


@pytest.fixture(scope="module")
def one_and_two(tiny_model_dir, tmp_path_factory):
    """The same config trained in this process and over 2 gloo processes (and the initial adapter)."""
    root = tmp_path_factory.mktemp("ddp")
    seqs = _data()
    one = train(_fp32(_cfg(tiny_model_dir, **_kw())), tiny_model_dir, seqs, root / "one", log=LOG)
    two_cfg = _fp32(_cfg(tiny_model_dir, **_kw(), distributed={"world_size": 2, "backend": "gloo"}))
    # the 2-process run is killed after step 1 and resumed: the torchrun test's uninterrupted run
    # must end byte-identical to it
    state = root / "state.pt"
    with pytest.raises(Exception, match="TrainingInterrupted"):
        train_distributed(two_cfg, tiny_model_dir, seqs, root / "cut", log=LOG, state_path=state, resume_key="k",
                          stop_after=1)
    cut_version = torch.load(state, weights_only=False)["version"]  # rank 0 wrote the state after step 1
    two = train_distributed(two_cfg, tiny_model_dir, seqs, root / "two", log=LOG, state_path=state, resume_key="k")
    init = Trainer(_fp32(_cfg(tiny_model_dir, **_kw())), tiny_model_dir, log=LOG).save_adapter(root / "init")
    return {"one": one, "two": two, "init": init, "root": root, "seqs": seqs, "cfg": two_cfg,
            "cut_version": cut_version}


def _adapter(d: Path) -> dict[str, torch.Tensor]:
    return load_file(d / "adapter_model.safetensors")


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_gloo_processes_train_the_one_process_adapter(one_and_two):
    one, two = one_and_two["one"], one_and_two["two"]
    assert len(one.steps) == len(two.steps) == 2
    a1, a2, a0 = _adapter(one.adapter_dir), _adapter(two.adapter_dir), _adapter(one_and_two["init"])
    assert _max_diff(a1, a2) <= 1e-5
    assert _max_diff(a1, a0) > 1e-3 and _max_diff(a2, a0) > 1e-3  # trained: not vacuously equal
    # the steps' metrics are the whole mini-batch's, summed over the ranks
    for r1, r2 in zip(one.steps, two.steps):
        assert (r1["tokens"], r1["sequences"], r1["step"]) == (r2["tokens"], r2["sequences"], r2["step"])
        for k in ("loss", "grad_norm", "entropy", "ratio_mean", "ratio_max", "ratio_min"):
            assert r2[k] == pytest.approx(r1[k], rel=1e-5, abs=1e-7), k
    assert two.steps[1]["ratio_max"] > 1.0  # the second step is off-policy: the comparison covers the clip path
    assert one_and_two["cut_version"] == 1  # and it was resumed after step 1 (the torchrun test: losing nothing)


@pytest.mark.slow
def test_the_train_stage_spawns_two_ranks_and_rank_0_writes_checkpoints_and_snapshots(tiny_model_dir, tmp_path):
    from tasks.train.stage import run_train
    from tests.train.test_arms import BASE, _store

    def cfg(**dist):
        return RunConfig.model_validate({**BASE, "policy": {"model": str(tiny_model_dir), "autocast_dtype": "float32"},
                                         "train": {"ppo_epochs": 2, "lr": 0.002, "micro_batch_size": 2, "save_every": 1,
                                                   "lora": {"r": 4, "alpha": 8}, **dist}})

    out = {}
    for name, c in (("one", cfg()), ("two", cfg(distributed={"world_size": 2}))):
        store, refs = _store(tmp_path / name, c)
        res = run_train(store, c, refs)
        out[name] = (store, store.rows(res["checkpoints"]), store.rows(res["train_steps"]))
    (s1, ck1, st1), (s2, ck2, st2) = out["one"], out["two"]
    assert [(c["name"], c["path"]) for c in ck2] == [(c["name"], c["path"]) for c in ck1] == [
        ("base", ""), ("final-step1", "train/checkpoints/step-1"), ("final", "train/checkpoints/step-2")]
    for c in ck2[1:]:  # the snapshot of step 1 was saved by rank 0 in a spawned process
        assert sha256_dir(Path(s2.root) / c["path"]) == c["adapter_sha256"]
        a1 = _adapter(Path(s1.root) / c["path"])
        d = _max_diff(a1, _adapter(Path(s2.root) / c["path"]))
        assert d <= 1e-5  # 1.5e-6 here (lr 0.002; at lr 0.01 the second PPO pass clips half the tokens and
        # rounding moves tokens across the clip boundary: 7.5e-5)
        assert max(float(v.abs().max()) for k, v in a1.items() if "lora_B" in k) > 1e-3  # trained (B starts at 0)
    assert [r["tokens"] for r in st2] == [r["tokens"] for r in st1]
    assert [r["loss"] for r in st2] == pytest.approx([r["loss"] for r in st1], rel=1e-5, abs=1e-7)
    assert (Path(s2.root) / "train/state/trainer_state.pt").is_file()


def test_two_processes_with_dropout_killed_and_resumed_end_byte_identical(tiny_model_dir, tmp_path):
    # each rank draws its own dropout masks for its own share, so each rank's random streams are
    # saved (gathered to rank 0) and each rank resumes with its own. 4 groups, 2 a step: after the
    # resume, rank 1 trains a group of its own with its own stream
    cfg = _fp32(_cfg(tiny_model_dir, **_kw(), lora={"r": 4, "alpha": 8, "dropout": 0.1},
                     distributed={"world_size": 2, "backend": "gloo"}))
    seqs = _seqs(n=12, group=3)
    full = train_distributed(cfg, tiny_model_dir, seqs, tmp_path / "full", log=LOG)
    state = tmp_path / "state.pt"
    with pytest.raises(Exception, match="TrainingInterrupted"):
        train_distributed(cfg, tiny_model_dir, seqs, tmp_path / "cut", log=LOG, state_path=state, resume_key="k",
                          stop_after=1)
    ranks = torch.load(state, weights_only=False)["rng_streams"]["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["cpu"], ranks[1]["cpu"])  # the ranks' streams differ
    resumed = train_distributed(cfg, tiny_model_dir, seqs, tmp_path / "resumed", log=LOG, state_path=state,
                                resume_key="k")
    assert len(full.steps) == 2 and [r["sequences"] for r in full.steps] == [6, 6]
    assert [r["loss"] for r in resumed.steps] == [r["loss"] for r in full.steps]
    assert sha256_dir(tmp_path / "resumed") == sha256_dir(tmp_path / "full")


def test_under_bf16_autocast_one_and_two_processes_differ_by_at_most_two_learning_rates(tiny_model_dir, tmp_path):
    # what docs/scale-out.md states: under bf16 autocast (the default) the rounding of a forward
    # depends on the batch's shapes, which differ between 1 process (the whole mini-batch's
    # micro-batches) and 2 (each rank's share); AdamW's normalised first steps (about lr * sign(g))
    # turn the gradient components near 0 whose sign that rounding flips into steps of lr the
    # other way. Measured at lr 0.01: 1 vs 2 processes 0.0149 (25 of 16,384 weights apart by more
    # than lr / 2); 1 process with micro-batches of 1 instead of 2: 0.0200 (the shapes, not the
    # process count); in float32 8.4e-6 (test_two_gloo_processes_train_the_one_process_adapter)
    lr = 0.01
    kw = {**_kw(), "lr": lr}
    seqs = _data()
    one = train(_cfg(tiny_model_dir, **kw), tiny_model_dir, seqs, tmp_path / "one", log=LOG)
    two = train_distributed(_cfg(tiny_model_dir, **kw, distributed={"world_size": 2, "backend": "gloo"}),
                            tiny_model_dir, seqs, tmp_path / "two", log=LOG)
    mb1 = train(_cfg(tiny_model_dir, **{**kw, "micro_batch_size": 1}), tiny_model_dir, seqs, tmp_path / "mb1", log=LOG)
    a1, a2, a3 = _adapter(one.adapter_dir), _adapter(two.adapter_dir), _adapter(mb1.adapter_dir)
    init = Trainer(_cfg(tiny_model_dir, **kw), tiny_model_dir, log=LOG).save_adapter(tmp_path / "init")
    assert _max_diff(a1, _adapter(init)) > lr  # trained: the bound is not vacuous
    assert _max_diff(a1, a2) <= 2 * lr  # the documented bound
    far = sum(int(((a1[k] - a2[k]).abs() > lr / 2).sum()) for k in a1)
    total = sum(v.numel() for v in a1.values())
    assert far <= total // 100, (far, total)  # a few weights, not the adapter: 25 of 16,384 measured
    assert _max_diff(a1, a3) > 1e-4  # one process with other shapes differs as much: bf16, not the ranks


@pytest.mark.slow
def test_torchrun_ranks_follow_rank_0_and_train_the_one_process_adapter(one_and_two, tiny_model_dir):
    import subprocess
    import sys

    out = one_and_two["root"] / "torchrun"
    job = Path(__file__).with_name("torchrun_job.py")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(job), str(tiny_model_dir), str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 1: ran 1 job(s)" in p.stdout and "rank 0: 2 steps" in p.stdout
    assert _max_diff(_adapter(one_and_two["one"].adapter_dir), _adapter(out)) <= 1e-5
    # spawned or torchrun: the same ranks; and the spawned run, killed after step 1 and resumed,
    # ends byte for byte where this uninterrupted one ends
    assert sha256_dir(out) == sha256_dir(one_and_two["two"].adapter_dir)


def test_cli_train_needs_torchrun_and_run_refuses_to_run_once_per_torchrun_process(monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    r = CliRunner().invoke(app, ["train", "-c", "configs/default.yaml"])
    assert r.exit_code == 2 and "runs under torchrun" in r.output
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = CliRunner().invoke(app, ["run", "-c", "configs/default.yaml"])
    assert r.exit_code == 2 and "use `torchrun ... harnessrl train`" in r.output


def test_cli_train_refuses_a_world_size_torchrun_did_not_start_before_freeze(monkeypatch, tmp_path):
    # every rank stops in one line, before the pipeline runs anything (no run folder is made)
    from typer.testing import CliRunner

    import flows.pipeline
    from flows.cli import app
    from tasks.train import distributed as D

    ran = []  # what would have run: the pipeline, joining the group, following rank 0
    monkeypatch.setattr(flows.pipeline, "through_train", lambda *a, **k: ran.append("pipeline"))
    monkeypatch.setattr(D, "join", lambda *a, **k: ran.append("join"))
    monkeypatch.setattr(D, "follow", lambda *a, **k: ran.append("follow") or 0)
    monkeypatch.setattr(D, "finish", lambda *a, **k: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        r = CliRunner().invoke(app, ["train", "-c", "configs/default.yaml", "--run-dir", str(tmp_path / "run"),
                                     "--set", "train.distributed.world_size=3"])
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines() == [
            "configs/default.yaml: train.distributed.world_size=3 but torchrun started 2 processes (WORLD_SIZE); "
            "set train.distributed.world_size: 2"]
    assert not ran and not (tmp_path / "run").exists()


# ---- FSDP: the base weights sharded over the ranks --------------------------------------------------

class _ShardProbe:
    """``after_step`` of the FSDP runs (rank 0, in the spawned process): what the trainer holds,
    written to ``path`` as JSON after each step."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __call__(self, trainer, row) -> None:
        import json

        from torch.distributed.tensor import DTensor

        layers = [p for n, p in trainer.model.named_parameters() if ".layers." in n and "lora_" not in n]
        sharded = [p for p in layers if isinstance(p, DTensor)]
        try:  # a merged whole-model copy cannot be made from a shard
            trainer.merged_state("float32")
            refused = ""
        except RuntimeError as e:
            refused = str(e)
        Path(self.path).write_text(json.dumps({"refused": refused,
            "layer_weights": len(layers), "sharded": len(sharded),
            "local": sum(p.to_local().numel() for p in sharded), "global": sum(p.numel() for p in sharded),
            "lora_replicated": not any(isinstance(p, DTensor) for p in trainer.params),
            "lora": len(trainer.params), "step": row["step"]}))


def _shared_prompts(seqs):
    """The same sequences with each group's prompt made its first member's (the shared-prompt
    forward then runs: every FSDP layer is called twice in one forward)."""
    first: dict[str, list[int]] = {}
    out = []
    for s in seqs:
        n = s.mask.index(1)
        p = first.setdefault(s.task_id, s.ids[:n])
        out.append(dataclasses.replace(s, ids=p + s.ids[n:], mask=[0] * len(p) + s.mask[n:],
                                       behaviour_logp=[0.0] * len(p) + s.behaviour_logp[n:]))
    return out


@pytest.fixture(scope="module")
def fsdp_runs(tiny_model_dir, tmp_path_factory):
    """The DDP test's config with the base weights sharded (FSDP2 over 2 gloo processes): killed
    after its first step and resumed; and on the same data with shared prompts, with the
    one-process run to compare."""
    root = tmp_path_factory.mktemp("fsdp")
    cfg = _fp32(_cfg(tiny_model_dir, **_kw(), distributed={"world_size": 2, "backend": "gloo", "fsdp": True}))
    state = root / "state.pt"
    with pytest.raises(Exception, match="TrainingInterrupted"):
        train_distributed(cfg, tiny_model_dir, _data(), root / "cut", log=LOG, state_path=state, resume_key="k",
                          stop_after=1)
    cut_version = torch.load(state, weights_only=False)["version"]
    # shared prompts, no KL, and a first mini-batch whose groups have constant rewards: step 1 runs
    # no forward (zero advantages) right after the batch's no-grad passes, and rank 0 alone saves
    # the resumable state before step 2's forwards (a root FSDP unit left whole by the no-grad
    # passes and resharded by rank 0's save alone would make the ranks' all-gathers differ)
    plain = {**_kw(), "kl": {"beta": 0.0}}
    c1 = _fp32(_cfg(tiny_model_dir, **plain))
    c2 = _fp32(_cfg(tiny_model_dir, **plain, distributed={"world_size": 2, "backend": "gloo", "fsdp": True}))
    # 4 groups of 3, 2 a step; the second step's groups then made 3 and 2 sequences: with
    # micro-batches of 2 one rank runs [shared, single] and the other [shared] plus a padding
    # pass, so the ranks' votes on the shared-prompt path pair up as in the no-grad passes only
    # when the padding comes after a rank's own micro-batches in both (else the step computes a
    # micro-batch another way than its old log-probs, and its ratio is not exactly 1)
    shared = _shared_prompts(_seqs(n=12, group=3))
    groups = plan_groups([s.reward for s in shared], [s.task_id for s in shared], [s.harness_id for s in shared],
                         c1.train.grouping, scale=c1.train.advantage_scale).groups
    sched = frozen_schedule(c1, groups)
    first, drop = set(sched[0][3]), max(sched[1][3])
    shared = [dataclasses.replace(s, reward=1.0) if i in first else s for i, s in enumerate(shared) if i != drop]
    return {
        "probe": root / "probe.json", "cut_version": cut_version,
        "two": train_distributed(cfg, tiny_model_dir, _data(), root / "two", log=LOG, state_path=state,
                                 resume_key="k", after_step=_ShardProbe(root / "probe.json")),
        "shared_one": train(c1, tiny_model_dir, shared, root / "s1", log=LOG),
        "shared_two": train_distributed(c2, tiny_model_dir, shared, root / "s2", log=LOG,
                                        state_path=root / "s2-state.pt", resume_key="s"),
    }


def test_fsdp_shards_the_base_weights_and_two_processes_train_the_one_process_adapter(one_and_two, fsdp_runs):
    import json

    probe = json.loads(fsdp_runs["probe"].read_text())
    # every decoder-layer base weight is a DTensor holding half of it on rank 0; the LoRA weights
    # (what the optimizer steps) stay plain replicated tensors
    assert probe["step"] == 2 and probe["layer_weights"] == probe["sharded"] > 0
    assert probe["local"] * 2 == probe["global"]
    assert probe["lora_replicated"] and probe["lora"] > 0
    assert "merged_state: the base weights are sharded" in probe["refused"]
    one, two, a0 = one_and_two["one"], fsdp_runs["two"], _adapter(one_and_two["init"])
    assert _max_diff(_adapter(one.adapter_dir), _adapter(two.adapter_dir)) <= 1e-5
    assert _max_diff(_adapter(two.adapter_dir), a0) > 1e-3  # trained
    for r1, r2 in zip(one.steps, two.steps, strict=True):
        assert (r1["tokens"], r1["sequences"]) == (r2["tokens"], r2["sequences"])
        for k in ("loss", "kl", "grad_norm", "ratio_max"):
            assert r2[k] == pytest.approx(r1[k], rel=1e-5, abs=1e-7), k
    # killed after step 1 and resumed, it ends byte for byte where DDP's run ends (itself resumed, and
    # equal to torchrun's uninterrupted one): the same step as DDP's, and a resume that loses nothing
    assert fsdp_runs["cut_version"] == 1
    assert sha256_dir(two.adapter_dir) == sha256_dir(one_and_two["two"].adapter_dir)
    # with shared prompts (each layer runs twice per forward), a step without a forward, and rank 0
    # saving the state between the passes and the next forward
    s1, s2 = fsdp_runs["shared_one"], fsdp_runs["shared_two"]
    assert [r["grad_norm"] for r in s2.steps][0] == 0.0 and s2.steps[1]["grad_norm"] > 0  # step 1: no signal
    assert [r["sequences"] for r in s2.steps] == [6, 5]
    # step 2 trains the weights its old log-probs were computed with (step 1 changed nothing)
    assert s1.steps[1]["ratio_min"] == s1.steps[1]["ratio_max"] == 1.0
    assert s2.steps[1]["ratio_min"] == s2.steps[1]["ratio_max"] == 1.0
    assert _max_diff(_adapter(s1.adapter_dir), _adapter(s2.adapter_dir)) <= 1e-5
    assert _max_diff(_adapter(s2.adapter_dir), a0) > 1e-3
    assert [r["tokens"] for r in s1.steps] == [r["tokens"] for r in s2.steps]
