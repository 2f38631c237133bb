"""The common-random-numbers hook under BiPA's replay: records with a noise key give per-request
seeds that depend on (call seed, key, sample, turn) only, and the vLLM request carries them."""

from types import SimpleNamespace

import pytest

from tasks.harnesses.spec import SamplingSpec
from tasks.hashing import seed_from
from tasks.rollout.engines.vllm_engine import VLLMPolicy
from tasks.rollout.fanout import episode_jobs
from tasks.rollout.harness import request_seeds


def _jobs(harness_id, key=True):
    recs = [{"record_id": f"{harness_id}-{t}", "task_id": t, **({"noise_key": f"fresh:{t}"} if key else {})}
            for t in ("a", "b")]
    return episode_jobs(recs, {"a": {}, "b": {}}, 2, seed=11, tag="bipa-fresh", policy_id="p")


def test_noise_seeds_depend_on_the_key_not_the_harness():
    one, two = _jobs("h1"), _jobs("h2")
    assert [j.noise_seed for j in one] == [j.noise_seed for j in two]  # same (key, sample): same noise
    assert [j.seed for j in one] != [j.seed for j in two]  # the episodes' own seeds still differ
    assert one[0].noise_seed == seed_from(11, "fresh:a", 0) and len({j.noise_seed for j in one}) == 4
    pol = SimpleNamespace(request_seeds_supported=True)
    assert request_seeds(one, 1, pol) == [seed_from(j.noise_seed, 1) for j in one]
    assert request_seeds(one, 0, pol) != request_seeds(one, 1, pol)  # each turn its own draw
    assert request_seeds(_jobs("h1", key=False), 0, pol) is None


def test_noise_keys_refuse_a_policy_without_per_request_seeds_and_a_mixed_batch():
    with pytest.raises(ValueError, match="cannot take per-request seeds"):
        request_seeds(_jobs("h1"), 0, SimpleNamespace())
    with pytest.raises(ValueError, match="mixes records"):
        request_seeds(_jobs("h1") + _jobs("h2", key=False), 0, SimpleNamespace(request_seeds_supported=True))


def test_the_vllm_request_carries_the_given_seeds():
    eng = SimpleNamespace(eos_id=2, adapter_dir=None, progress_every_s=1.0)
    s = SamplingSpec(temperature=0.7, max_new_tokens=8)
    assert VLLMPolicy.generate_request(eng, [[1], [2]], s, 5)["seeds"] == [seed_from(5, 0), seed_from(5, 1)]
    assert VLLMPolicy.generate_request(eng, [[1], [2]], s, 5, [7, 9])["seeds"] == [7, 9]
    with pytest.raises(Exception, match="1 request_seeds for 2 prompts"):
        VLLMPolicy.generate_request(eng, [[1], [2]], s, 5, [7])
