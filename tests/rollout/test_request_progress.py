"""Progress within one ``generate`` call: the engines report requests as they finish
(:func:`tasks.progress.requests_done`), the harness engine turns them into turn slots, and the
sampled tokens are the ones sampled without anyone listening. The vLLM engine's side is in
test_engines_vllm.py."""

from __future__ import annotations

import pytest

from tasks.config import PolicyConfig, RunConfig, SandboxConfig
from tasks.harnesses.spec import SamplingSpec, load_harness
from tasks.progress import eta, on_requests_done, requests_done
from tasks.records.freeze import freeze_tables
from tasks.rollout.harness import EpisodeJob, run_episodes
from tasks.rollout.generation import Generation
from tests.rollout.test_engines_vllm import eos_prone_model


def test_requests_done_reaches_the_innermost_listener_only_inside_its_block():
    outer: list[int] = []
    inner: list[int] = []
    requests_done(3)  # nobody listens: nothing happens
    with on_requests_done(outer.append):
        requests_done(2)
        with on_requests_done(inner.append):
            requests_done(1)
            requests_done(0)  # nothing done: not passed on
        requests_done(4)
    requests_done(5)
    assert (outer, inner) == ([2, 4], [1])


def test_eta_extrapolates_the_rate_so_far():
    assert eta(0, 10, 5.0) == "ETA ?"
    assert eta(5, 10, 20.0) == "ETA 20s"
    assert eta(1, 10, 20.0) == "ETA 3m00s"
    assert eta(1, 1000, 20.0) == "ETA 5h33m"
    assert eta(10, 10, 20.0) == "ETA 0s"


def test_hf_engine_reports_each_row_at_its_eos_and_samples_the_same(tiny_model_dir, tmp_path):
    """Rows that draw EOS are reported at that decoding step, the rest when their batch ends: more
    reports than batches, counts adding up to the prompts, and the same completions as a batch
    sampled without the reporting processor (the code before it) and as a call nobody listens to."""
    from tasks.rollout.engines.hf import HFPolicy

    model_dir = eos_prone_model(tiny_model_dir, tmp_path / "eos")
    cfg = PolicyConfig(model=str(model_dir), rollout_dtype="float32", batch_size=8, batch_overhead_tokens=0)
    pol = HFPolicy(model_dir, cfg, base_model_id="tiny")
    prompts = [pol.tokenizer.encode(f"Calculate {i} + 4.") for i in range(16)]
    # EOS takes ~0.5% of the mass per step in this model: over 100 steps about 7 of 16 rows stop,
    # P(none) ~ 1e-3 and P(all) far below whatever the sampler's draws
    s = SamplingSpec(temperature=1.0, max_new_tokens=100)
    got: list[int] = []
    with on_requests_done(got.append):
        gens = pol.generate(prompts, s, seed=3)
    stopped = sum(g.finish_reason == "stop" for g in gens)
    assert 0 < stopped < len(gens), [g.finish_reason for g in gens]
    assert all(n > 0 for n in got) and sum(got) == len(prompts)
    assert len(got) > 2  # two batches of 8: per-batch reporting would give exactly 2
    assert gens == pol.generate(prompts, s, seed=3)  # nobody listening
    plan_rows = [list(range(0, 8)), list(range(8, 16))]  # equal lengths: the plan keeps arrival order
    plain = [g for b, rows in enumerate(plan_rows) for g in pol._generate_batch([prompts[i] for i in rows], s, 3 + b)]
    assert [g.token_ids for g in gens] == [g.token_ids for g in plain]
    assert [g.logprobs for g in gens] == [g.logprobs for g in plain]


class _ReportingPolicy:
    """Replies "Answer: 7" to every prompt and reports ``per_request`` finished requests per
    prompt while it 'samples' (as an engine streaming completions does)."""

    def __init__(self, tokenizer, per_request: int = 1):
        self.tokenizer, self.per_request, self.calls = tokenizer, per_request, 0

    def generate(self, prompts, sampling, seed):
        self.calls += 1
        ids = self.tokenizer.encode("Let me think." if self.calls == 1 else "Answer: 7", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        out = []
        for _ in prompts:
            requests_done(self.per_request)
            out.append(Generation(ids, [-0.5] * len(ids), "stop", self.tokenizer.decode(ids)))
        return out


@pytest.mark.parametrize("per_request,expected", [(1, [0, 1, 1, 1, 0, 1, 1, 1, 3]), (3, [0, 3, 0, 3, 3])])
def test_run_episodes_counts_reported_requests_as_turn_slots_once(tiny_model_dir, per_request, expected):
    """Each request the engine reports finished moves the turn-slot count during the batch; the
    turn's own report then adds only the slots not yet counted, so the total stays exactly
    episodes x max_turns, even for an engine that over-reports (capped at the batch's requests)."""
    from transformers import AutoTokenizer

    cfg = RunConfig(name="e", suites=[{"name": "basic_arithmetic", "size": 3, "seed": 11}], harnesses=["react-python"])
    tasks, _, records = freeze_tables(cfg)
    spec = load_harness("react-python")  # max_turns 3
    jobs = [EpisodeJob(f"ep{i}", records[i], tasks[i], 0, 0) for i in range(3)]
    pol = _ReportingPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), per_request)
    slots: list[int] = []
    eps, _ = run_episodes(pol, spec, jobs, SandboxConfig(), seed=0, on_turns=slots.append)
    assert [e["num_turns"] for e in eps] == [2, 2, 2]
    # before turn 0: nothing; turn 0: one slot per request as reported, then nothing more; turn
    # 1: likewise, then the one slot each submitted episode no longer needs
    assert slots == expected
    assert sum(slots) == len(jobs) * spec.max_turns
