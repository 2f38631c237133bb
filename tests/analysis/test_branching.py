"""P1's per-step mismatch by branching: scripted policies make every continuation's outcome known,
so V*_K, V^pi, the per-step mismatch, its telescoping sum and the replay checks are exact."""

from __future__ import annotations

import json
import math

import pytest

from tasks.analysis.branching import ReplayPolicy, branch_states, step_mismatch_summary
from tasks.config import RunConfig, SandboxConfig
from tasks.evaluate.stats import pass_at_k
from tasks.harnesses.spec import load_harness
from tasks.records.freeze import freeze_tables
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.generation import Generation
from tests.facilities import bwrap_missing, require


def _gen(tok, text):
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    return Generation(ids, [-0.25] * len(ids), "stop", text)


class Script:
    """Replies with a fixed script per turn (the same for every prompt): records an episode."""

    def __init__(self, tok, script):
        self.tokenizer, self.script, self.calls = tok, script, 0

    def generate(self, prompts, sampling, seed):
        text = self.script[self.calls]
        self.calls += 1
        return [_gen(self.tokenizer, text) for _ in prompts]


class BranchPolicy:
    """The analysed policy. At a first-turn state (one assistant turn opened) the prompt at an
    even position of the batch gets a code action and an odd one a wrong answer; at any later
    state the right answer. So from s_0 half of an episode's (even count of) continuations
    succeed, from s_1 all do."""

    def __init__(self, tok, answer):
        self.tokenizer, self.answer, self.calls = tok, answer, []

    def generate(self, prompts, sampling, seed):
        self.calls.append((len(prompts), seed))
        out = []
        for i, p in enumerate(prompts):
            turn = self.tokenizer.decode(p).count("<|im_start|>assistant") - 1
            if turn == 0:
                text = "Let me check.\n```python\nprint(6)\n```" if i % 2 == 0 else "Answer: 987654"
            else:
                text = f"Answer: {self.answer}"
            out.append(_gen(self.tokenizer, text))
        return out


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def task_record():
    cfg = RunConfig(name="b", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11}],
                    harnesses=["react-python", "direct"])
    tasks, _, records = freeze_tables(cfg)
    return tasks[0], [r for r in records if r["task_id"] == tasks[0]["task_id"]]


def _record(tok, spec, task, rec, eid, sample_idx, script):
    """Run one scripted episode and return its (episodes row, turns rows) as the artifacts hold them."""
    eps, turns = run_episodes(Script(tok, script), spec, [EpisodeJob(eid, rec, task, sample_idx, 7)], SandboxConfig(),
                              seed=0)
    e = eps[0]
    row = {"episode_id": eid, "task_id": task["task_id"], "harness_id": spec.harness_id, "harness_name": spec.name,
           "group_id": "g", "sample_idx": sample_idx, "seed": 7, "reward": e["reward"], "success": e["success"],
           "status": e["status"], "num_turns": e["num_turns"]}
    return row, turns


def test_replay_policy_forces_then_delegates(tok):
    inner = BranchPolicy(tok, "1")
    a, b = [1, 2, 3], [4, 5]
    ga = [_gen(tok, "x"), _gen(tok, "y")]
    gb = [_gen(tok, "z"), _gen(tok, "w")]
    rp = ReplayPolicy(inner, {tuple(a): tuple(ga), tuple(b): tuple(gb)}, 2)
    assert rp.tokenizer is tok
    assert rp.generate([b, a], None, 5) == [gb[0], ga[0]]
    assert rp.generate([a + [9, 9], b + [8]], None, 6) == [ga[1], gb[1]]  # found by the first prompt
    assert inner.calls == []
    got = rp.generate([a + [1], b + [2]], None, 11)  # turn 2: one call to the wrapped policy, same seed
    assert inner.calls == [(2, 11)] and len(got) == 2
    with pytest.raises(RuntimeError, match="starts with no recorded"):
        ReplayPolicy(inner, {tuple(a): tuple(ga)}, 1).generate([[7, 7]], None, 0)
    with pytest.raises(RuntimeError, match="once per turn"):  # turn 1's recorded prompt at call 0
        ReplayPolicy(inner, {tuple(a): tuple(ga)}, 2, {tuple(a): [tuple(a), tuple(a + [8])]}).generate(
            [a + [8]], None, 0)
    with pytest.raises(ValueError, match="fewer than depth"):
        ReplayPolicy(inner, {tuple(a): tuple(ga)}, 3)


def test_single_turn_harness_has_only_s0(tok, task_record):
    task, recs = task_record
    spec = load_harness("direct")
    rec = next(r for r in recs if r["harness_name"] == "direct")
    answer = json.loads(task["verifier_spec"])["answer"]
    ok, t_ok = _record(tok, spec, task, rec, "ok", 0, [f"Answer: {answer}"])
    bad, t_bad = _record(tok, spec, task, rec, "bad", 1, ["Answer: 987654"])
    assert (ok["success"], bad["success"]) == (True, False)

    class Alternate(BranchPolicy):  # position 0, 2, ... right; 1, 3, ... wrong
        def generate(self, prompts, sampling, seed):
            self.calls.append((len(prompts), seed))
            return [_gen(self.tokenizer, f"Answer: {self.answer}" if i % 2 == 0 else "Answer: 987654")
                    for i in range(len(prompts))]

    pol = Alternate(tok, answer)
    rows = branch_states(pol, spec, [ok, bad], t_ok + t_bad, {task["task_id"]: task}, SandboxConfig(), n=4, k=3, seed=1)
    assert len(pol.calls) == 1 and pol.calls[0][0] == 8  # one batched call for both episodes' continuations
    v = pass_at_k(4, 2, 3)
    assert v == pytest.approx(1.0)  # 2 failures cannot fill 3 draws
    r_ok, r_bad = rows
    assert (r_ok["episode_id"], r_ok["n"], r_ok["successes"], r_ok["v_pi"], r_ok["replay_ok"]) == ("ok", 4, 2, 0.5, True)
    assert r_ok["step_mismatch"] == pytest.approx(v - 1.0) and r_bad["step_mismatch"] == pytest.approx(v - 0.0)
    (s,) = step_mismatch_summary(rows)
    assert (s["n_episodes"], s["n_states"], s["n_complete"], s["replay_divergences"]) == (2, 2, 2, 0)
    assert s["m_step"] == pytest.approx(v - 0.5) and s["m_by_turn"] == [pytest.approx(v - 0.5)]
    assert s["mean_v_pi_s0"] == 0.5 and s["mean_success"] == 0.5
    again = branch_states(Alternate(tok, answer), spec, [ok, bad], t_ok + t_bad, {task["task_id"]: task},
                          SandboxConfig(), n=4, k=3, seed=1)
    assert again == rows
    with pytest.raises(ValueError, match="n must be >= k"):
        branch_states(pol, spec, [ok], t_ok, {task["task_id"]: task}, SandboxConfig(), n=2, k=3, seed=1)
    with pytest.raises(ValueError, match="not the spec's"):
        branch_states(pol, load_harness("react-python"), [ok], t_ok, {task["task_id"]: task}, SandboxConfig(),
                      n=2, k=1, seed=1)
    with pytest.raises(ValueError, match="turn_idx"):
        branch_states(pol, spec, [ok], [], {task["task_id"]: task}, SandboxConfig(), n=2, k=1, seed=1)


def test_multi_turn_branching_replays_and_telescopes(tok, task_record):
    require("bubblewrap", bwrap_missing())
    task, recs = task_record
    spec = load_harness("react-python")
    rec = next(r for r in recs if r["harness_name"] == "react-python")
    answer = json.loads(task["verifier_spec"])["answer"]
    # E: runs code, then answers wrong (T = 2, failure); F: answers right at once (T = 1);
    # D: prints a random number (the replay cannot reproduce its observation), then answers wrong
    E, tE = _record(tok, spec, task, rec, "E", 0, ["```python\nprint(2 + 2)\n```", "Answer: 987654"])
    F, tF = _record(tok, spec, task, rec, "F", 1, [f"Answer: {answer}"])
    D, tD = _record(tok, spec, task, rec, "D", 2, ["```python\nimport os\nprint(os.urandom(8).hex())\n```",
                                                   "Answer: 987654"])
    assert [(x["num_turns"], x["success"]) for x in (E, F, D)] == [(2, False), (1, True), (2, False)]
    pol = BranchPolicy(tok, answer)
    rows = branch_states(pol, spec, [D, F, E], tE + tF + tD, {task["task_id"]: task}, SandboxConfig(),
                         n=4, k=2, seed=3)
    by = {(r["episode_id"], r["turn_idx"]): r for r in rows}
    assert sorted(by) == [("D", 0), ("D", 1), ("E", 0), ("E", 1), ("F", 0)]
    v0 = pass_at_k(4, 2, 2)
    assert v0 == pytest.approx(5 / 6)
    for eid in "EFD":  # from s_0: two code actions (then the right answer) and two wrong answers
        r = by[(eid, 0)]
        assert (r["n"], r["successes"], r["v_pi"], r["replay_ok"], r["n_diverged"]) == (4, 2, 0.5, True, 0)
        assert r["v_star"] == pytest.approx(v0)
    e1, d1 = by[("E", 1)], by[("D", 1)]
    assert (e1["successes"], e1["v_star"], e1["v_pi"], e1["replay_ok"]) == (4, 1.0, 1.0, True)
    assert (d1["successes"], d1["replay_ok"], d1["n_diverged"]) == (4, False, 4)  # run from the diverged state
    assert by[("E", 0)]["step_mismatch"] == pytest.approx(v0 - 1.0)
    assert e1["step_mismatch"] == pytest.approx(1.0 - 0.0)
    assert by[("F", 0)]["step_mismatch"] == pytest.approx(v0 - 1.0)
    # telescoping: sum_t m_t = V*_K(s_0) - recorded success, for every episode
    for ep in (E, F, D):
        ms = [r["step_mismatch"] for r in rows if r["episode_id"] == ep["episode_id"]]
        assert math.fsum(ms) == pytest.approx(by[(ep["episode_id"], 0)]["v_star"] - float(ep["success"]), abs=1e-12)
    # calls: depth 0 -> one wave (12 continuations at turn 0, 6 code runs reach turn 1);
    # depth 1 -> E and D share a first prompt with different histories: two waves, forced turn 0
    assert [c[0] for c in pol.calls] == [12, 6, 4, 4]
    (s,) = step_mismatch_summary(rows)
    assert s["m_step"] == pytest.approx(((v0 - 0) + (v0 - 1) + (v0 - 0)) / 3)
    assert s["m_by_turn"] == [pytest.approx(v0 - 1.0), pytest.approx(1.0)] and s["n_by_turn"] == [3, 2]
    assert (s["replay_divergences"], s["diverged_continuations"], s["n_complete"], s["n_states"]) == (1, 4, 3, 5)
    # max_depth 1: s_1 is not branched, so the last branched m_t of a 2-turn episode is undefined
    short = branch_states(BranchPolicy(tok, answer), spec, [E, F], tE + tF, {task["task_id"]: task}, SandboxConfig(),
                          n=2, k=1, seed=3, max_depth=1)
    # (k = 1: V*_1 = V^pi; F's two continuations: one code action then right, one wrong answer)
    assert [(r["episode_id"], r["turn_idx"], r["v_star"], r["step_mismatch"]) for r in short] == [
        ("E", 0, 0.5, None), ("F", 0, 0.5, -0.5)]
    (s2,) = step_mismatch_summary(short)
    assert (s2["n_complete"], s2["m_step"], s2["m_by_turn"], s2["n_by_turn"]) == (1, -0.5, [-0.5], [1])


def test_branching_with_a_sampling_policy_is_reproducible(tiny_model_dir, tok, task_record):
    """The real transformers sampler under the replay wrapper: continuations are sampled (not
    forced) at s_0, seeded, and the same inputs + seed give the same rows."""
    from tasks.config import PolicyConfig
    from tasks.rollout.engines.hf import HFPolicy

    task, recs = task_record
    spec = load_harness("direct")
    spec = spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"max_new_tokens": 8})})
    rec = next(r for r in recs if r["harness_name"] == "direct")
    ep, t_ep = _record(tok, spec, task, rec, "x", 0, ["Answer: 987654"])
    pol = HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32"), base_model_id="t")
    seen = []
    orig = pol.generate

    def spy(prompts, sampling, seed):
        gens = orig(prompts, sampling, seed)
        seen.append([tuple(g.token_ids) for g in gens])
        return gens

    pol.generate = spy
    a = branch_states(pol, spec, [ep], t_ep, {task["task_id"]: task}, SandboxConfig(), n=3, k=2, seed=4)
    b = branch_states(pol, spec, [ep], t_ep, {task["task_id"]: task}, SandboxConfig(), n=3, k=2, seed=4)
    assert a == b and len(a) == 1 and (a[0]["n"], a[0]["replay_ok"]) == (3, True)
    assert seen[0] == seen[1] and len(seen[0]) == 3
    assert any(g != tuple(t_ep[0]["completion_token_ids"]) for g in seen[0])  # sampled, not the recorded reply
    c = branch_states(pol, spec, [ep], t_ep, {task["task_id"]: task}, SandboxConfig(), n=3, k=2, seed=5)
    assert seen[2] != seen[0] and len(c) == 1  # another seed, other continuations
