"""P1's log-odds check: batched sequence log-probs against a per-token reference computation,
the adapter on/off scorers, pair construction and the per-harness summary."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tasks.analysis.logodds import adapter_scorers, log_odds_pairs, log_odds_summary, sequence_logprobs


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from tasks.rollout.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model_dir, "cpu", "float32")


def _items():
    # three completions of one prompt (shared-prefix path), one of another, one empty completion
    p1 = [5, 17, 99, 3, 240, 8]
    p2 = [11, 12, 13]
    return [(p1, [40, 41, 42, 43]), (p1, [7]), (p2, [300, 301, 302, 303, 304, 305, 306]),
            (p1, [40, 41, 500]), (p2, [])]


def _manual(model, items, temperature):
    """Per-item, unbatched: log_softmax(logits / T) at each completion token, summed in float64."""
    out = []
    with torch.no_grad():
        for p, c in items:
            if not c:
                out.append(0.0)
                continue
            ids = torch.tensor([p + c])
            logits = model(input_ids=ids).logits[0].double()  # [L, V]
            lp = torch.log_softmax(logits / temperature, dim=-1)
            out.append(math.fsum(float(lp[len(p) - 1 + j, tok]) for j, tok in enumerate(c)))
    return out


def test_sequence_logprobs_equal_per_token_sums(tiny):
    model, tok = tiny
    items = _items()
    for temp in (1.0, 0.7):
        got = sequence_logprobs(model, tok, items, temperature=temp, batch_size=2)
        want = _manual(model, items, temp)
        assert got[4] == 0.0
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
        assert all(v < 0 for v in got[:4])
    # batch size never changes a value beyond float32 rounding
    a = sequence_logprobs(model, tok, items, temperature=1.0, batch_size=1)
    b = sequence_logprobs(model, tok, items, temperature=1.0, batch_size=5)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_sequence_logprobs_top_k_gives_minus_inf_outside_support(tiny):
    model, tok = tiny
    p, c = _items()[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([p + c])).logits[0]
    top1 = int(logits[len(p) - 1].argmax())
    other = (top1 + 1) % logits.shape[-1]
    got = sequence_logprobs(model, tok, [(p, [top1]), (p, [other])], temperature=1.0, top_k=1)
    assert got[0] == 0.0 and got[1] == -math.inf


def test_sequence_logprobs_rejects_bad_input(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="items\\[0\\]: empty prompt"):
        sequence_logprobs(model, tok, [([], [1])], temperature=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        sequence_logprobs(model, tok, [([1], [1])], temperature=1.0, batch_size=0)
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(model, tok, [([1], [1])], temperature=0.0)


@pytest.fixture()
def peft_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from tasks.rollout.models import load_model_and_tokenizer

    base, tok = load_model_and_tokenizer(tiny_model_dir, "cpu", "float32")
    torch.manual_seed(0)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                           task_type="CAUSAL_LM")), tok


def test_fresh_adapter_gives_exactly_the_reference(peft_model):
    model, tok = peft_model
    pol, ref = adapter_scorers(model, tok, batch_size=3)
    items = _items()[:4]
    assert pol(items, 1.0) == ref(items, 1.0)  # LoRA B = 0: bit-identical


def test_hand_set_adapter_scores_as_the_merged_model(peft_model, tiny_model_dir):
    from tasks.rollout.models import load_model_and_tokenizer

    model, tok = peft_model
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    pol, ref = adapter_scorers(model, tok, batch_size=2)
    items = _items()[:4]
    got_pol, got_ref = pol(items, 0.8), ref(items, 0.8)
    base, _ = load_model_and_tokenizer(tiny_model_dir, "cpu", "float32")
    np.testing.assert_allclose(got_ref, _manual(base, items, 0.8), atol=2e-4, rtol=0)
    merged = model.merge_and_unload()
    np.testing.assert_allclose(got_pol, _manual(merged, items, 0.8), atol=2e-4, rtol=0)
    assert max(abs(a - b) for a, b in zip(got_pol, got_ref)) > 0.05


def test_adapter_scorers_need_a_peft_model(tiny):
    model, tok = tiny
    with pytest.raises(TypeError, match="peft model"):
        adapter_scorers(model, tok)


# ---- pairs and summary with exact fake scorers ------------------------------------------------

def _spec(name, temperature=0.7):
    return SimpleNamespace(name=name, sampling=SimpleNamespace(temperature=temperature))


def _ep(eid, group, sample, reward, harness="h1", task="t1", status="ok"):
    return {"episode_id": eid, "task_id": task, "harness_id": harness, "harness_name": f"name-{harness}",
            "group_id": group, "sample_idx": sample, "reward": reward, "status": status}


def _turn(eid, prompt, completion, idx=0):
    # every turn here stores its whole prompt (only turn 0 is read)
    return {"episode_id": eid, "turn_idx": idx, "prompt_continues": False, "prompt_added_ids": prompt,
            "completion_token_ids": completion}


def _fake_scorers(calls):
    # policy: -len(completion) - 0.1 * first token; reference: -2 * len(completion)
    def pol(items, temperature):
        calls.append(("pol", temperature, len(items)))
        return [-len(c) - 0.1 * c[0] for _p, c in items]

    def ref(items, temperature):
        calls.append(("ref", temperature, len(items)))
        return [-2.0 * len(c) for _p, c in items]

    return pol, ref


def test_pairs_dedupe_candidates_and_use_mean_reward():
    P = [1, 2, 3]
    eps = [_ep("e0", "g", 0, 1.0), _ep("e1", "g", 1, 0.0), _ep("e2", "g", 2, 0.5), _ep("e3", "g", 3, 0.0),
           _ep("e4", "g", 4, 1.0, status="infra_error"),
           _ep("s0", "solo", 0, 1.0), _ep("s1", "solo", 1, 0.0)]  # a group with one distinct candidate
    turns = [_turn("e0", P, [10, 11]), _turn("e1", P, [20]), _turn("e2", P, [10, 11]), _turn("e3", P, [30, 31, 32]),
             _turn("e4", P, [40]), _turn("e1", P + [20, 9], [5], idx=1),
             _turn("s0", [7], [4]), _turn("s1", [7], [4])]
    calls = []
    pol, ref = _fake_scorers(calls)
    rows = log_odds_pairs(eps, turns, {"h1": _spec("h1")}, pol, ref)
    assert calls == [("pol", 0.7, 3), ("ref", 0.7, 3)]  # 3 distinct candidates, infra_error and the solo group out
    assert [(r["a_episode"], r["b_episode"]) for r in rows] == [("e0", "e1"), ("e0", "e3"), ("e1", "e3")]
    r01, r03, r13 = rows
    # candidate [10, 11]: episodes e0 (1.0) and e2 (0.5) -> reward 0.75
    assert r01["reward_diff"] == pytest.approx(0.75) and r03["reward_diff"] == pytest.approx(0.75)
    assert r13["reward_diff"] == 0.0
    assert r01["logodds_policy"] == pytest.approx((-2 - 1.0) - (-1 - 2.0))
    assert r01["logodds_ref"] == pytest.approx(-4.0 + 2.0)
    assert r03["logodds_ref"] == pytest.approx(-4.0 + 6.0)
    for r in rows:
        assert r["logodds_shift"] == pytest.approx(r["logodds_policy"] - r["logodds_ref"])
        assert (r["state_id"], r["task_id"], r["harness_name"]) == ("g", "t1", "h1")


def test_state_sampling_is_seeded_and_split_prompts_get_their_own_state():
    eps, turns = [], []
    for g in range(6):
        for s in range(3):
            eid = f"g{g}s{s}"
            eps.append(_ep(eid, f"grp{g}", s, float(s == 0)))
            prompt = [100 + g] + ([s] if g == 5 else [])  # group 5: each sample saw another first page
            turns.append(_turn(eid, prompt, [1 + s] * (s + 1)))
    pol, ref = _fake_scorers([])
    specs = {"h1": _spec("h1")}
    all_rows = log_odds_pairs(eps, turns, specs, pol, ref)
    assert len({r["state_id"] for r in all_rows}) == 5  # group 5's three one-episode states have no pair
    a = log_odds_pairs(eps, turns, specs, pol, ref, max_states_per_harness=2, seed=3)
    b = log_odds_pairs(eps, turns, specs, pol, ref, max_states_per_harness=2, seed=3)
    assert a == b and len({r["state_id"] for r in a}) == 2 and len(a) == 6
    picks = {frozenset(r["state_id"] for r in log_odds_pairs(eps, turns, specs, pol, ref, max_states_per_harness=2,
                                                              seed=s)) for s in range(8)}
    assert len(picks) > 1  # the seed matters
    eps.append(_ep("x", "grp6", 0, 0.0))
    eps.append(_ep("y", "grp6", 1, 0.0))
    turns += [_turn("x", [1], [2]), _turn("y", [9], [2]), _turn("x2", [1], [3])]
    eps.append(_ep("x2", "grp6", 2, 1.0))
    sids = {r["state_id"] for r in log_odds_pairs(eps, turns, specs, pol, ref)}
    assert any(s.startswith("grp6#") for s in sids)
    with pytest.raises(ValueError, match="max_states_per_harness"):
        log_odds_pairs(eps, turns, specs, pol, ref, max_states_per_harness=0)
    with pytest.raises(ValueError, match="no turn with turn_idx 0"):
        log_odds_pairs(eps + [_ep("z", "g9", 0, 0.0)], turns, specs, pol, ref)


def test_non_finite_scores_are_refused():
    eps = [_ep("a", "g", 0, 1.0), _ep("b", "g", 1, 0.0)]
    turns = [_turn("a", [1], [2]), _turn("b", [1], [3])]

    def bad(items, t):
        return [0.0, -math.inf]

    with pytest.raises(ValueError, match="non-finite"):
        log_odds_pairs(eps, turns, {"h1": _spec("h1")}, bad, bad)


def test_summary_correlations_and_nulls():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=20)
    rdiff = rng.choice([-1.0, 0.0, 1.0], size=20)
    pol = ref + 2.0 * rdiff + rng.normal(scale=0.1, size=20)
    rows = [{"harness_name": "A", "state_id": f"s{i % 4}", "logodds_policy": float(p), "logodds_ref": float(r),
             "logodds_shift": float(p - r), "reward_diff": float(d)} for i, (p, r, d) in enumerate(zip(pol, ref, rdiff))]
    rows += [{"harness_name": "B", "state_id": "s", "logodds_policy": 1.0, "logodds_ref": 0.5, "logodds_shift": 0.5,
              "reward_diff": 0.0}] * 2
    rows += [{"harness_name": "C", "state_id": f"s{i}", "logodds_policy": float(i), "logodds_ref": float(i),
              "logodds_shift": 0.0, "reward_diff": float(i)} for i in range(4)]
    a, b, c = log_odds_summary(rows)
    assert (a["harness_name"], a["n_states"], a["n_pairs"]) == ("A", 4, 20)
    assert a["pearson_policy_ref"] == pytest.approx(np.corrcoef(pol, ref)[0, 1])
    ranks = lambda v: np.argsort(np.argsort(v))  # noqa: E731 - no ties in continuous draws
    assert a["spearman_policy_ref"] == pytest.approx(np.corrcoef(ranks(pol), ranks(ref))[0, 1])
    assert a["spearman_policy_ref"] != pytest.approx(a["pearson_policy_ref"])
    assert a["pearson_shift_reward"] == pytest.approx(np.corrcoef(pol - ref, rdiff)[0, 1])
    assert a["pearson_shift_reward"] > 0.9
    assert a["mean_abs_shift"] == pytest.approx(float(np.mean(np.abs(pol - ref))))
    assert (b["n_pairs"], b["pearson_policy_ref"], b["spearman_policy_ref"], b["pearson_shift_reward"]) == (2, None, None, None)
    # C: policy == reference (spearman 1), the shift has zero variance -> null
    assert c["pearson_policy_ref"] == pytest.approx(1.0) and c["pearson_shift_reward"] is None


def test_reference_log_odds_equal_the_recorded_behaviour_logprobs(tiny_model_dir):
    """End to end on real rollouts: the base policy samples a group under ``direct`` (temperature
    0.7, no top-k/top-p), so the sampler's recorded log-probs are exactly the reference's
    temperature-only scores; a fresh adapter shifts nothing."""
    from peft import LoraConfig, get_peft_model

    from tasks.config import PolicyConfig, RunConfig, SandboxConfig
    from tasks.harnesses.spec import load_harness
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.harness import EpisodeJob, run_episodes
    from tasks.rollout.engines.hf import HFPolicy

    cfg = RunConfig(name="l", suites=[{"name": "basic_arithmetic", "size": 2, "seed": 5}], harnesses=["direct"])
    tasks, _, records = freeze_tables(cfg)
    spec = load_harness("direct")
    spec = spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"max_new_tokens": 10})})
    pol = HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32", batch_size=8),
                   base_model_id="tiny")
    task = {t["task_id"]: t for t in tasks}[records[0]["task_id"]]
    jobs = [EpisodeJob(f"e{i}", records[0], task, i, i) for i in range(4)]
    eps, turns = run_episodes(pol, spec, jobs, SandboxConfig(), seed=0)
    rows_in = [{"episode_id": e["episode_id"], "task_id": task["task_id"], "harness_id": "H", "harness_name": "direct",
                "group_id": "g", "sample_idx": i, "reward": e["reward"], "status": e["status"]}
               for i, e in enumerate(eps)]
    model = get_peft_model(pol.model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    rows = log_odds_pairs(rows_in, turns, {"H": spec}, *adapter_scorers(model, pol.tokenizer, batch_size=3))
    recorded = {t["episode_id"]: math.fsum(t["completion_logprobs"]) for t in turns}
    distinct = len({tuple(t["completion_token_ids"]) for t in turns})
    assert distinct >= 2 and len(rows) == distinct * (distinct - 1) // 2
    for r in rows:
        assert r["logodds_ref"] == pytest.approx(recorded[r["a_episode"]] - recorded[r["b_episode"]], abs=2e-3)
        assert r["logodds_shift"] == 0.0
