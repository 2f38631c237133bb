"""A tiny TalkMesh run end to end (freeze -> proposals -> head -> talk GRPO on the tiny model ->
mesh, baselines, collusion -> tables, report, plot) with a scripted policy whose answers are
known: proposal sample j of a problem is right iff j is even; hints state the source's answer;
a revision adopts the hint's answer."""

from __future__ import annotations

import re

import pytest

from schemas import ArtifactStore
from tasks.rollout.generation import Generation
from tasks.talkmesh.config import TalkMeshRunConfig
from tasks.talkmesh.talk import HINT_SYSTEM


class ScriptedPolicy:
    policy_id = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.seen: dict[str, int] = {}
        self.calls: list[str] = []

    def generate(self, prompts, sampling, seed):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            if HINT_SYSTEM[:30] in text:
                self.calls.append("hint")
                reply = "Check the sum."
            elif "A hint from another student" in text:
                self.calls.append("revise")
                reply = "Answer: " + re.search(r"The hint's answer: ([^;]+);", text).group(1)
            else:
                self.calls.append("propose")
                j = self.seen.get(text, 0)
                self.seen[text] = j + 1
                value = eval(re.search(r"Calculate (.+?)\.", text).group(1), {"__builtins__": {}})  # test-made
                reply = f"Answer: {int(value)}" if j % 2 == 0 else "Answer: 987654"
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.1] * len(ids), "stop", reply))
        return out


def _cfg(model_dir, **tm):
    return TalkMeshRunConfig.model_validate({
        "name": "talkmesh-e2e", "seed": 1,
        "suites": [{"name": "basic_arithmetic", "size": 8, "seed": 2,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        # a findings config needs a disjoint split (refused at load otherwise)
        "split": {"test_fraction": 0.5, "disjoint": "findings" in tm}, "harnesses": ["direct"],
        "policy": {"model": str(model_dir), "autocast_dtype": "float32", "rollout_dtype": "float32"},
        "rollout": {"task_runner": "serial"},
        "train": {"micro_batch_size": 16, "kl": {"beta": 0.0}},
        "talkmesh": {"train_problems": 2, "test_problems": 4, "train_samples": 4, "samples": 6, "agents": 4,
                     "threshold": 1.0, "talk_group": 1, "colluders": [2], "resamples": 1,
                     "head": {"steps": 20}, **tm},
    })


def test_tiny_talkmesh_run(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from tasks.records.stage import run_freeze
    from tasks.talkmesh.run import run_talkmesh

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = _cfg(tiny_model_dir)
    pols = []

    def load(adapter):
        pols.append((adapter, ScriptedPolicy(tok)))
        return pols[-1][1]

    store = ArtifactStore(tmp_path)
    refs = run_talkmesh(store, cfg, run_freeze(store, cfg, {}), load)
    assert pols[0][0] is None and pols[1][0].name == "adapter"  # base, then the trained talk adapter

    curves = {(r["method"], r["k"]): r["accuracy"] for r in store.rows(refs["talkmesh_curves"])}
    assert len(curves) == 2 * 6
    # samples alternate right, wrong: majority over 1 sample is right; over 2 a tie goes to the first (right)
    assert curves[("majority", 1)] == 1.0 and curves[("majority", 2)] == 1.0

    summary = {r["condition"]: r for r in store.rows(refs["talkmesh_summary"])}
    assert set(summary) == {"majority-agents", "confidence-weighted-agents", "mesh-base", "mesh-talk",
                            "collusion-m2-undefended", "collusion-m2-defended", "collusion-m2-majority"}
    # the 4 agents' proposals are right, wrong, right, wrong: a 2:2 tie goes to the first (right) answer
    assert summary["majority-agents"]["accuracy"] == 1.0 and summary["majority-agents"]["outputs_spent"] == 4.0
    contrasts = {(c["a"], c["b"]): c for c in store.manifest("talkmesh", "talkmesh_summary")["extra"]["contrasts"]}
    mb = contrasts[("mesh-base", "majority-agents")]
    assert mb["problems"] == 4 and mb["accuracy_b"] == 1.0
    assert mb["difference"] == pytest.approx(summary["mesh-base"]["accuracy"] - 1.0)
    assert mb["ci_low"] <= mb["difference"] <= mb["ci_high"]
    assert ("collusion-m2-defended", "collusion-m2-majority") in contrasts
    # every contrast is between the conditions' own accuracies on the same problems
    assert len(contrasts) == 7
    for (a, b), c in contrasts.items():
        assert (c["accuracy_a"], c["accuracy_b"]) == (summary[a]["accuracy"], summary[b]["accuracy"])
        assert c["difference"] == pytest.approx(c["accuracy_a"] - c["accuracy_b"])
    # threshold 1.0: every agent but the source revises, adopting the source's answer and keeping it only
    # when it scores higher; one hint per problem (full topology)
    msgs = store.rows(refs["talkmesh_messages"])
    base = [m for m in msgs if m["condition"] == "mesh-base"]
    assert len(base) == 4 * 4  # problems x agents x 1 round
    for m in base:
        if m["hint_source"] >= 0:
            assert m["revision_answer"] == m["hint_answer"]
            assert m["kept"] == (m["revision_confidence"] > m["confidence"])
    res = [r for r in store.rows(refs["talkmesh_results"]) if r["condition"] == "mesh-base"]
    revs = {pid: sum(m["revision"] is not None for m in base if m["problem_id"] == pid) for pid in {m["problem_id"] for m in base}}
    assert all(r["outputs_spent"] == 4 + 1 + revs[r["problem_id"]] for r in res)
    assert all(r["consensus"] for r in res)  # a full mesh agrees after one gossip step
    # the colluders' poisoned answers are graded wrong and tie the honest right ones 2:2 or beat them
    coll = [m for m in msgs if m["condition"] == "collusion-m2-undefended" and m["colluder"]]
    assert len(coll) == 4 * 2 and not any(m["correct_before"] for m in coll)

    talk = store.rows(refs["talkmesh_talk_sequences"])
    assert {t["kind"] for t in talk} == {"hint", "revision"}
    assert all(t["reward"] in (-1.0, 0.0, 1.0) for t in talk if t["kind"] == "revision")
    calib = store.rows(refs["talkmesh_calibration"])
    assert {c["split"] for c in calib} == {"train", "test"} and sum(c["n"] for c in calib if c["split"] == "train") == 2 * 4
    report = (tmp_path / "talkmesh" / "report.md").read_text()
    assert "| mesh-base | base | 0 | no |" in report and "ECE" in report
    assert f"| mesh-base | majority-agents | 4 | {summary['mesh-base']['accuracy']:.3f} | 1.000 |" in report
    assert (tmp_path / "talkmesh" / "accuracy_vs_outputs.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "talkmesh" / "talk_adapter" / "adapter_config.json").is_file()

    # sealed: the trained adapter's hash is chained before the first trained mesh, the collusion
    # conditions after; a swapped adapter file is caught
    from tasks.evaluate.seal import SealError
    from tasks.talkmesh.seal import verify_talkmesh

    assert verify_talkmesh(store).rows == 4 * 6 + 4 + 1 + 4 + 4 + 4
    sealed = store.raw_rows("talkmesh", "talkmesh_sealed")
    kinds = [(r["kind"], r["condition"]) for r in sealed[24:]]
    assert kinds == [("mesh", "mesh-base")] * 4 + [("state", None)] + [("mesh", "mesh-talk")] * 4 + \
        [("mesh", "collusion-m2-undefended")] * 4 + [("mesh", "collusion-m2-defended")] * 4
    cfg_file = tmp_path / "talkmesh" / "talk_adapter" / "adapter_config.json"
    cfg_file.write_text(cfg_file.read_text().replace('"r":', '"r": 1, "was_r":', 1))
    with pytest.raises(SealError, match="talkmesh/talk_adapter: files hash .*the talk adapter changed"):
        verify_talkmesh(store)


def test_config_errors_name_the_field(tiny_model_dir):
    with pytest.raises(ValueError, match="talkmesh.agents=8 exceeds talkmesh.samples=6"):
        _cfg(tiny_model_dir, agents=8)
    with pytest.raises(ValueError, match=r"talkmesh.colluders=\[4\]"):
        _cfg(tiny_model_dir, colluders=[4])
    with pytest.raises(ValueError, match="odd"):
        _cfg(tiny_model_dir, agents=3, samples=6, train_samples=4, colluders=[1], topology="regular", degree=1)
    with pytest.raises(ValueError, match="talkmesh.harness='react-python'"):
        _cfg(tiny_model_dir, harness="react-python")


def test_shipped_config_loads():
    from tasks.talkmesh.config import load_talkmesh_config

    cfg = load_talkmesh_config("configs/talkmesh-small.yaml")
    assert cfg.suites[0].name == "gsm_symbolic" and cfg.policy.engine == "vllm" and cfg.talkmesh.samples == 32
    arith = load_talkmesh_config("configs/talkmesh-arith.yaml")
    assert arith.suites[0].name == "basic_arithmetic" and arith.talkmesh == cfg.talkmesh


def test_arith_config_has_enough_distinct_problems():
    """Freezing drops duplicate problems; talkmesh-arith's suite must still fill both splits."""
    from tasks.records.freeze import split_by_hash
    from tasks.records.suites.base import load_suite
    from tasks.talkmesh.config import load_talkmesh_config

    cfg = load_talkmesh_config("configs/talkmesh-arith.yaml")
    tasks = {t.task_hash: t for t in load_suite(cfg.suites[0])}
    splits = split_by_hash(list(tasks.values()), cfg.split.test_fraction)
    n_test = sum(s == "test" for s in splits.values())
    assert n_test >= cfg.talkmesh.test_problems and len(splits) - n_test >= cfg.talkmesh.train_problems


def test_same_config_same_bytes(tiny_model_dir, tmp_path):
    """Two runs of one config and seed (talk training off, to stay fast) write identical tables."""
    from transformers import AutoTokenizer

    from tasks.records.stage import run_freeze
    from tasks.talkmesh.run import run_talkmesh

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = _cfg(tiny_model_dir, train_talk=False, test_problems=2, topology="ring")
    shas = []
    for k in range(2):
        store = ArtifactStore(tmp_path / str(k))
        refs = run_talkmesh(store, cfg, run_freeze(store, cfg, {}), lambda adapter: ScriptedPolicy(tok))
        shas.append({n: r.sha256 for n, r in refs.items()})
        shas[-1]["png"] = (tmp_path / str(k) / "talkmesh" / "accuracy_vs_outputs.png").read_bytes()
    assert "talkmesh_talk_sequences" not in shas[0] and shas[0] == shas[1]
    # without talk training there is no mesh-talk, so its contrasts are skipped, not faked
    extra = ArtifactStore(tmp_path / "0").manifest("talkmesh", "talkmesh_summary")["extra"]
    assert {(c["a"], c["b"]) for c in extra["contrasts"]} == {
        ("mesh-base", "majority-agents"), ("mesh-base", "confidence-weighted-agents"),
        ("collusion-m2-defended", "collusion-m2-undefended"), ("collusion-m2-defended", "collusion-m2-majority"),
        ("collusion-m2-undefended", "collusion-m2-majority")}
