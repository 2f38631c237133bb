"""``benchmarks/learning.py`` beyond its smoke: TRL's side scores a completion as our side does
(the harness's grade, then one truncation rule), and the row's figures from stored curves, worked
out by hand. The statistics themselves: tests/benchmarks/test_learning_stats.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tasks.config import SandboxConfig
from tasks.harnesses.spec import load_harness
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.train.sequences import build_sequences
from tests.rollout.test_harness_engine import ScriptedPolicy, task_and_record  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from learning import completion_cut, goal_verdict, iteration_split, reply_reward, summarize  # noqa: E402


def test_completion_cut_means_limit_reached_without_an_end_token():
    eos = {2}
    assert completion_cut([5, 6, 7], 3, eos)          # at the limit, no EOS: cut
    assert not completion_cut([5, 6, 2], 3, eos)      # at the limit, ending in EOS: finished
    assert not completion_cut([5, 2], 3, eos)         # stopped early
    assert completion_cut([5, 6, 7, 8], 3, eos)


@pytest.mark.parametrize("rule", ["zero", "graded"])
@pytest.mark.parametrize("script,finish", [
    ("Answer: {answer}", "stop"), ("Answer: {answer} and then some more wor", "length"),
    ("I think it is 3, no, {answer}", "stop"), ("I think it is 3, no, {answer}", "length"),
    ("Answer: {wrong}", "stop"), ("no number here", "stop"), ("no number", "length")])
def test_trl_reward_is_the_reward_our_side_trains_on(tiny_model_dir, task_and_record, script, finish,  # noqa: F811
                                                     rule):
    from transformers import AutoTokenizer

    task, rec = task_and_record
    answer = json.loads(task["verifier_spec"])["answer"]
    text = script.format(answer=answer, wrong=f"{answer}1")
    spec = load_harness("direct")
    pol = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), [text], finish)
    eps, turns = run_episodes(pol, spec, [EpisodeJob("e", rec, task, 0, 0)], SandboxConfig(), seed=0)
    ep = dict(eps[0], task_id=task["task_id"], task_hash=task["task_hash"], harness_id=spec.harness_id)
    seqs, _ = build_sequences([ep], turns, {spec.harness_id: (1.0, 0, 1.0)}, truncated_reward=rule)
    ours = seqs[0].reward
    assert reply_reward(spec, task, text, finish == "length", rule) == ours
    # and the cases differ where they should: a cut right answer is 0 only under "zero"
    if finish == "length" and "{answer}" in script:
        assert ours == (0.0 if rule == "zero" else 1.0)


def test_reply_reward_refuses_an_unknown_rule(task_and_record):  # noqa: F811
    with pytest.raises(ValueError, match="truncated_reward='half'"):
        reply_reward(load_harness("direct"), task_and_record[0], "Answer: 1", False, "half")


def _run(seed, adapters):
    snaps = [{"mark_s": m, "iterations": i, "weights_s": m - 10 if a else 0.0, "adapter": a}
             for m, (i, a) in zip((200.0, 400.0), adapters)]
    return {"seed": seed, "result": {"snapshots": snaps, "iterations": 5, "stop_s": 410.0, "samples_per_s": 1.0}}


def test_summarize_by_hand():
    # budget 400 s, marks 200 and 400, target 0.4, base 0.2 (two held-out tasks)
    evals = {"base": [0.2, 0.2], "o0a": [0.6, 0.6], "o0b": [0.6, 0.6], "o1a": [0.3, 0.3], "o1b": [0.5, 0.5],
             "t0b": [0.4, 0.4], "t1b": [0.3, 0.3], "h0a": [0.3, 0.3], "h0b": [0.5, 0.5], "h1a": [0.3, 0.3],
             "h1b": [0.5, 0.5]}
    runs = {"ours": [_run(0, [(2, "o0a"), (4, "o0b")]), _run(1, [(2, "o1a"), (4, "o1b")])],
            "trl": [_run(0, [(0, None), (1, "t0b")]), _run(1, [(0, None), (1, "t1b")])],
            "ours_hf": [_run(0, [(1, "h0a"), (2, "h0b")]), _run(1, [(1, "h1a"), (2, "h1b")])]}
    row = summarize(runs, evals, 400.0, 0.4, 2000)
    # ours: 0.2 -> 0.6 over 0-200 s reaches 0.4 at 100 s; 0.3 at 200 s -> 0.5 at 400 s reaches it at 300 s
    assert [r["time_to_target_s"] for r in row["runs"]["ours"]] == [100.0, 300.0]
    # TRL: 0.2 at 200 s (the base still), 0.4 at 400 s: 400 s; never for seed 1 (counted as the budget, 400)
    assert [r["time_to_target_s"] for r in row["runs"]["trl"]] == [400.0, None]
    assert row["ours_time_to_target_s"] == [100.0, 300.0] and row["trl_time_to_target_s"] == [400.0, None]
    assert row["same_sampler"]["ours_hf_time_to_target_s"] == [300.0, 300.0]
    # speed-up 400 / 200 = 2.0, a lower bound (a TRL seed never reached it); over seeds, ours' mean is
    # 100, 200 or 300 (P 1/4, 1/2, 1/4) and TRL's always 400: the interval is [400/300, 400/100]
    assert row["speedup"] == 2.0 and row["speedup_bound"] == "lower"
    assert row["speedup_not_reached"] == {"slow": 1, "fast": 0}
    assert row["speedup_ci_low"] == pytest.approx(1.333, abs=1e-3) and row["speedup_ci_high"] == 4.0
    # equal time (the 400 s snapshots): ours (0.6 + 0.5) / 2, TRL (0.4 + 0.3) / 2
    assert row["ours_pass_at_1"] == 0.55 and row["trl_pass_at_1"] == 0.35
    assert row["ours_minus_trl_pass_at_1"] == 0.2
    assert row["ours_pass_at_1_ci_low"] == 0.5 and row["ours_pass_at_1_ci_high"] == 0.6  # seeds; tasks are alike
    # same sampler: ours with hf reaches it at 300 s on both seeds; trainer 400 / 300, engine 300 / 200
    ss = row["same_sampler"]
    assert ss["trainer_speedup"] == pytest.approx(1.333, abs=1e-3) and ss["trainer_speedup_bound"] == "lower"
    assert ss["engine_speedup"] == 1.5 and ss["engine_speedup_bound"] == "exact"
    assert ss["ours_hf_pass_at_1"] == 0.5
    # the snapshots carry their mark, iteration count, weights time and pass@1
    assert row["runs"]["trl"][0]["snapshots"][0] == {"mark_s": 200.0, "iterations": 0, "weights_s": 0.0,
                                                     "pass_at_1": 0.2}
    g = goal_verdict(row)
    assert g["met"] is True and "lower" in g["why"]


def test_iteration_split_leaves_the_first_iteration_out():
    # iterations end at 50, 80, 120 s; sampling took 30 (with the load), 20 and 24 s of them
    res = {"iteration_s": [50.0, 80.0, 120.0], "sample_s": [30.0, 20.0, 24.0]}
    # after the first: intervals 30, 40 -> sampling median 22, the rest (10, 16) median 13
    assert iteration_split(res) == {"sample_s_per_iteration": 22.0, "other_s_per_iteration": 13.0}
    one = iteration_split({"iteration_s": [50.0], "sample_s": [30.0]})
    assert one["sample_s_per_iteration"] is None and "model load" in one["split_note"]
    old = iteration_split({"iteration_s": [50.0, 80.0]})
    assert old["other_s_per_iteration"] is None and "not recorded" in old["split_note"]


def test_summarize_splits_sampling_from_the_rest_per_arm():
    evals = {"base": [0.2, 0.2], "a": [0.5, 0.3], "t": [0.3, 0.3]}
    ours = _run(0, [(1, "a"), (2, "a")])
    ours["result"].update(iteration_s=[40.0, 60.0, 80.0], sample_s=[30.0, 8.0, 12.0])
    trl = _run(0, [(0, None), (1, "t")])
    trl["result"].update(iteration_s=[150.0, 300.0], sample_s=[100.0, 110.0])
    hf = _run(0, [(1, "a"), (2, "a")])  # an older run: no sampling times
    row = summarize({"ours": [ours], "trl": [trl], "ours_hf": [hf]}, evals, 400.0, 0.35, 200)
    split = row["same_sampler"]["split"]
    assert split["ours"] == {"sample_s_per_iteration": 10.0, "other_s_per_iteration": 10.0}
    assert split["trl"] == {"sample_s_per_iteration": 110.0, "other_s_per_iteration": 40.0}
    assert split["ours_hf"]["sample_s_per_iteration"] is None and "not recorded" in split["ours_hf"]["split_note"]
    assert row["runs"]["trl"][0]["other_s_per_iteration"] == 40.0


def test_summarize_without_trl_and_goal_undefined():
    evals = {"base": [0.2, 0.2], "a": [0.5, 0.3]}
    row = summarize({"ours": [_run(0, [(1, "a"), (2, "a")])]}, evals, 400.0, 0.35, 200)
    assert row["speedup"] is None and "no TRL runs" in row["speedup_reason"]
    assert "tasks only" in row["ours_pass_at_1_note"] and "same_sampler" not in row
    assert goal_verdict(row)["met"] is None


def test_goal_verdict_says_not_met_and_why():
    g = goal_verdict({"speedup": 1.6, "speedup_ci_low": 0.9, "speedup_bound": "exact"})
    assert g["met"] is False and "not met" in g["why"] and "1.6" in g["why"]
    g = goal_verdict({"speedup": 2.5, "speedup_ci_low": 0.9, "speedup_bound": "exact"})
    assert g["met"] is False  # the interval's lower end is not above 1
    g = goal_verdict({"speedup": 2.5, "speedup_ci_low": 1.4, "speedup_bound": "upper"})
    assert g["met"] is None and "upper bound" in g["why"]
