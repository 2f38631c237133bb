"""A killed TalkMesh run resumes: the steps it finished are reused, not generated again, and the
tables equal those of a run that was never killed."""

from __future__ import annotations

import pytest

from schemas import ArtifactStore
from tasks.talkmesh.mesh import MeshResult, Output, Problem
from tasks.talkmesh.resume import StepCache, decode, encode


def test_encode_decode_round_trip():
    out = Output("Answer: 3", "3", (1, 2), (3, 4), (-0.5, -0.25))
    res = MeshResult(messages=[{"agent": 0, "confidence": 0.7, "hint": None}], results=[{"correct": True}],
                     revisions=[{"problem": Problem("p", "q", "exact", "{}"), "hint": out, "revision_correct": False}])
    back = decode(encode([res, (out, [out])]))
    assert back[0] == res and back[1] == [out, [out]]
    assert isinstance(back[0].revisions[0]["hint"].token_ids, tuple)
    with pytest.raises(TypeError, match="cannot keep a set"):
        encode({"a": {1, 2}})
    with pytest.raises(TypeError, match="keys must be strings"):
        encode({1: "x"})


def test_step_cache_reuses_a_finished_step_and_counts_its_seconds(tmp_path):
    store = ArtifactStore(tmp_path)
    calls = []
    c = StepCache(store, "ab" * 32)
    assert c.step("s", lambda: calls.append(1) or [Output("t", None)]) == [Output("t", None)]
    again = StepCache(store, "ab" * 32)
    assert again.step("s", lambda: calls.append(2) or "other") == [Output("t", None)]
    assert calls == [1] and again.reused == ["s"] and again.reused_s >= 0.0
    assert StepCache(store, "cd" * 32).step("s", lambda: "fresh") == "fresh"  # another key: not reused
    again.clear()
    assert not store.exists("talkmesh/resume/" + "ab" * 8 + "/s.json")
    assert StepCache(store, "ab" * 32).step("s", lambda: "made again") == "made again"


class Killed(RuntimeError):
    pass


def test_a_killed_run_resumes_where_it_stopped(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from tasks.records.stage import run_freeze
    from tasks.talkmesh.run import run_talkmesh
    from tests.talkmesh.test_findings import FirstFourRight
    from tests.talkmesh.test_run_e2e import _cfg

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = _cfg(tiny_model_dir, train_talk=False, test_problems=3, samples=8, train_samples=6, mesh_sizes=[2],
               mesh_repeats=2, colluders=[1])

    class DiesOnFirstCall(FirstFourRight):
        def generate(self, prompts, sampling, seed):
            raise Killed("killed")

    # uninterrupted
    whole = ArtifactStore(tmp_path / "whole")
    refs_whole = run_talkmesh(whole, cfg, run_freeze(whole, cfg, {}), lambda adapter: FirstFourRight(tok))
    # killed when the second policy (the evaluation meshes after mesh-base) first generates
    store = ArtifactStore(tmp_path / "resumed")
    frozen = run_freeze(store, cfg, {})
    pols = []

    def dies_second(adapter):
        pols.append(FirstFourRight(tok) if not pols else DiesOnFirstCall(tok))
        return pols[-1]

    with pytest.raises(Killed):
        run_talkmesh(store, cfg, frozen, dies_second)
    kept = sorted(p.rsplit("/", 1)[-1] for p in store.fs.find(store._abs("talkmesh/resume")))
    assert kept == ["mesh-base-r1.json", "mesh-base.json", "proposals.json"]
    # resumed: the first policy is asked for nothing (proposals and mesh-base are kept)
    again = []

    def counting(adapter):
        again.append(FirstFourRight(tok))
        return again[-1]

    refs = run_talkmesh(store, cfg, frozen, counting)
    assert again[0].talk.calls == [] and not again[0].seen
    assert again[1].talk.calls  # the rest of the meshes ran
    for name in ("talkmesh_messages", "talkmesh_results", "talkmesh_curves", "talkmesh_budget", "talkmesh_calibration"):
        assert refs[name].sha256 == refs_whole[name].sha256, name
    timing = store.manifest("talkmesh", "talkmesh_summary")["extra"]["timing"]
    assert timing["reused_s"] > 0.0 and timing["total_s"] >= timing["reused_s"]
    assert not store.exists("talkmesh/resume")  # removed once the tables are written


def test_a_run_killed_after_talk_training_reuses_the_stored_adapter(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from tasks.records.stage import run_freeze
    from tasks.talkmesh.run import run_talkmesh
    from tests.talkmesh.test_run_e2e import ScriptedPolicy, _cfg

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = _cfg(tiny_model_dir, test_problems=2, colluders=[])
    store = ArtifactStore(tmp_path)
    frozen = run_freeze(store, cfg, {})
    loads = []

    def dies_loading_the_adapter(adapter):
        loads.append(adapter)
        if adapter is not None:
            raise Killed("killed while loading the trained talk policy")
        return ScriptedPolicy(tok)

    with pytest.raises(Killed):
        run_talkmesh(store, cfg, frozen, dies_loading_the_adapter)
    kept = sorted(p.rsplit("/", 1)[-1] for p in store.fs.find(store._abs("talkmesh/resume")))
    assert kept == ["mesh-base.json", "proposals.json", "talk-train.json", "train-0.json"]
    pols = []

    def load(adapter):
        pols.append((adapter, ScriptedPolicy(tok)))
        if adapter is not None:  # the adapter the killed attempt trained, fetched from the run folder
            assert (adapter / "adapter_config.json").read_bytes() == \
                store.read_bytes("talkmesh/talk_adapter/adapter_config.json")
        return pols[-1][1]

    refs = run_talkmesh(store, cfg, frozen, load)
    assert pols[0][1].calls == [] and pols[1][0].name == "adapter" and pols[1][1].calls
    steps = store.manifest("talkmesh", "talkmesh_talk_sequences")["extra"]["train_steps"]
    assert steps and "talkmesh_talk_sequences" in refs
    assert not store.exists("talkmesh/resume")
    # the plan the killed attempt committed is the one the resumed run sealed its rows to
    from tasks.talkmesh.seal import verify_talkmesh

    assert verify_talkmesh(store).rows == len(store.raw_rows("talkmesh", "talkmesh_sealed"))
