"""The ``vllm`` engine against the trainer's recomputation (tasks/train/logprobs.py) on the tiny model.

Tolerances: in float32 both sides compute the same float32 logits with different kernels (vLLM's
CPU attention and GEMMs vs PyTorch's), so the processed log-probs agree to float32 rounding,
measured <= 1e-6 nats; 1e-4 leaves headroom while still catching any processing mismatch (a
missing temperature is off by ~0.1 or more, raw instead of top-k/top-p-renormalised log-probs by
log of the kept mass, > 0.01 here). Needs .venv-vllm (scripts/setup-vllm.sh).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tasks.config import PolicyConfig, RunConfig
from tasks.harnesses.spec import SamplingSpec
from tasks.train.logprobs import token_logprobs
from tests.facilities import require_vllm_venv

SAMPLINGS = [SamplingSpec(temperature=1.0, max_new_tokens=20),
             SamplingSpec(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=20)]
F32_TOL = 1e-4


def make_lora_adapter(model_dir: Path, out: Path, seed: int = 1) -> Path:
    """A rank-8 peft LoRA adapter on every projection with random (non-zero) A and B, so that it
    changes the model's outputs (a fresh adapter has B = 0 and changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(
        r=8, lora_alpha=16, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft.save_pretrained(out)
    return out


def eos_prone_model(model_dir: Path, out: Path, beta: float = 0.35) -> Path:
    """A copy of the tiny model whose (tied) EOS embedding row is ``beta`` times the unit mean
    direction of its final hidden states: EOS then gets ~2% of the mass per step (~0.1% in the
    random tiny model), so completions end on EOS within a test's few hundred tokens."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(model_dir, out)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        hs = torch.cat([model.model(input_ids=torch.tensor([tok.encode(f"Calculate {i} + 4.")])).last_hidden_state[0]
                        for i in range(8)])
        v = hs.mean(0)
        model.get_input_embeddings().weight[tok.eos_token_id] = beta * v / v.norm()
    model.save_pretrained(out)
    return out


def recompute(model, prompt: list[int], completion: list[int], s: SamplingSpec) -> torch.Tensor:
    """``[T]`` float32 log-probs of ``completion`` after ``prompt`` as the trainer computes them."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1:-1]
    return token_logprobs(logits, ids[:, len(prompt):], temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)[0]


def reference_model(model_dir: Path, adapter: Path | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def prompts_for(tok) -> list[list[int]]:
    # the same prompt twice: per-request seeds must give them different completions
    return [tok.encode("Calculate 3 + 4."), tok.encode("What is 12 - 5? Answer:"), tok.encode("Calculate 3 + 4.")]


@pytest.fixture(scope="module")
def eos_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return eos_prone_model(tiny_model_dir, tmp_path_factory.mktemp("eos") / "model")


@pytest.fixture(scope="module")
def vllm_f32(eos_model_dir):
    require_vllm_venv()
    from tasks.rollout.engines.vllm_engine import VLLMPolicy
    from tasks.rollout.engines import load_policy

    cfg = RunConfig(name="v", suites=[{"name": "basic_arithmetic", "size": 3}], harnesses=["react-python"],
                    policy={"model": str(eos_model_dir), "engine": "vllm", "rollout_dtype": "float32"})
    pol = load_policy(cfg)  # the engine is picked by policy.engine
    assert isinstance(pol, VLLMPolicy)
    yield pol
    pol.close()


def test_vllm_float32_logprobs_equal_trainer_recomputation(vllm_f32, eos_model_dir):
    ref = reference_model(eos_model_dir)
    for s in SAMPLINGS:
        prompts = prompts_for(vllm_f32.tokenizer)
        gens = vllm_f32.generate(prompts, s, seed=3)
        assert len(gens) == len(prompts)
        assert gens[0].token_ids != gens[2].token_ids  # same prompt, different per-request seed
        for p, g in zip(prompts, gens):
            assert 0 < len(g.token_ids) <= s.max_new_tokens and len(g.logprobs) == len(g.token_ids)
            assert g.finish_reason == ("stop" if g.token_ids[-1] == vllm_f32.eos_id else "length")
            assert g.text == vllm_f32.tokenizer.decode(g.token_ids, skip_special_tokens=True)
            diff = (recompute(ref, p, g.token_ids, s) - torch.tensor(g.logprobs)).abs().max().item()
            assert diff < F32_TOL, (s, diff)
        if s.top_k:  # processed, not raw: the raw log-probs (T=1, no truncation) are far off
            p, g = prompts[1], gens[1]
            raw = recompute(ref, p, g.token_ids, SamplingSpec(max_new_tokens=s.max_new_tokens))
            assert (raw - torch.tensor(g.logprobs)).abs().max().item() > 0.05


def test_vllm_same_seed_same_result_other_seed_differs(vllm_f32):
    prompts = prompts_for(vllm_f32.tokenizer)
    a = vllm_f32.generate(prompts, SAMPLINGS[0], seed=11)
    b = vllm_f32.generate(prompts, SAMPLINGS[0], seed=11)
    c = vllm_f32.generate(prompts, SAMPLINGS[0], seed=12)
    assert a == b
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_vllm_batch_of_long_seeded_prompts(vllm_f32):
    """More prompt tokens in one call than a scheduler step holds: with chunked prefill a seeded
    request cut mid-prefill crashed vLLM's CPU worker ("CPU Generator does not use offset")."""
    tok = vllm_f32.tokenizer
    base = tok.encode(" ".join(str(i) for i in range(700)))[:1500]
    prompts = [base[i:] + tok.encode(f" {i}") for i in range(12)]  # ~17k prompt tokens
    gens = vllm_f32.generate(prompts, SAMPLINGS[0], seed=5)
    assert len(gens) == 12 and all(0 < len(g.token_ids) <= SAMPLINGS[0].max_new_tokens for g in gens)
    assert gens == vllm_f32.generate(prompts, SAMPLINGS[0], seed=5)


def test_vllm_stops_at_eos_like_trim_completion(vllm_f32):
    """Completions end on the first EOS (kept), or run to max_new_tokens without one."""
    tok = vllm_f32.tokenizer
    prompts = [tok.encode(f"Calculate {i} + 4.") for i in range(16)]
    gens = vllm_f32.generate(prompts, SamplingSpec(temperature=1.0, max_new_tokens=40), seed=0)
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert 0 < len(stopped) < len(gens), [g.finish_reason for g in gens]
    for g in stopped:
        assert g.token_ids[-1] == vllm_f32.eos_id and vllm_f32.eos_id not in g.token_ids[:-1]
    for g in gens:
        if g.finish_reason == "length":
            assert len(g.token_ids) == 40 and vllm_f32.eos_id not in g.token_ids


def test_vllm_reports_requests_as_they_finish(vllm_f32):
    """The worker streams how many requests have finished while the batch runs: the listener
    hears increasing counts before the reply (the EOS-stopped requests finish steps before the
    40-token ones), adding up to the prompts, and the completions are those of a call nobody
    listens to at the default pace."""
    from tasks.progress import on_requests_done

    tok = vllm_f32.tokenizer
    prompts = [tok.encode(f"Calculate {i} + 4.") for i in range(16)]
    s = SamplingSpec(temperature=1.0, max_new_tokens=40)
    quiet = vllm_f32.generate(prompts, s, seed=0)
    got: list[int] = []
    vllm_f32.progress_every_s = 0.0  # a progress line after every engine step that finishes some
    try:
        with on_requests_done(got.append):
            gens = vllm_f32.generate(prompts, s, seed=0)
    finally:
        del vllm_f32.progress_every_s  # the class's pace again
    assert gens == quiet
    stopped = sum(g.finish_reason == "stop" for g in gens)
    assert 0 < stopped < len(gens)
    assert all(n > 0 for n in got) and sum(got) == len(prompts)
    assert len(got) >= 2 and sum(got[:-1]) <= stopped and got[-1] >= len(prompts) - stopped, got


def test_vllm_step_loop_samples_what_llm_generate_samples(vllm_f32, tmp_path):
    """The worker's step loop (progress as requests finish) gives the tokens, log-probs and finish
    reasons of ``LLM.generate`` (what the worker called before) for the same seeded requests, in
    prompt order, on an engine started with the worker's own arguments; and the engine's reply is
    the same."""
    import json
    import subprocess

    from tasks.rollout.engines.vllm_engine import WORKER, worker_env

    py = require_vllm_venv()
    tok = vllm_f32.tokenizer
    prompts = [tok.encode(f"Calculate {i} + 4.") for i in range(12)] + [tok.encode("What is 12 - 5? Answer:")]
    s = SamplingSpec(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=40)
    req = vllm_f32.generate_request(prompts, s, seed=7)
    script = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("harnessrl_vllm_worker_under_test", sys.argv[1])
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
cfg, req = json.loads(sys.argv[2]), json.loads(sys.argv[3])
from vllm import LLM
from vllm.inputs import TokensPrompt
llm = LLM(**w.engine_kwargs(cfg))
prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
rows = lambda rs: [[list(r.outputs[0].token_ids), [float(st[t].logprob) for t, st in zip(r.outputs[0].token_ids,
                   r.outputs[0].logprobs)], r.outputs[0].finish_reason] for r in rs]
seen = []
steps = rows(w.generate_in_steps(llm, prompts, w.sampling_params(req), None, seen.append, 0.0))
plain = rows(llm.generate(prompts, w.sampling_params(req), use_tqdm=False))
print("RESULT " + json.dumps({"steps": steps, "generate": plain, "seen": seen}))
"""
    proc = subprocess.run([str(py), "-c", script, str(WORKER), json.dumps(vllm_f32.worker_config), json.dumps(req)],
                          env=worker_env(vllm_f32.cfg), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["steps"] == res["generate"]
    assert len({tuple(r[0]) for r in res["generate"]}) > 1 and {r[2] for r in res["generate"]} == {"stop", "length"}
    assert res["seen"] == sorted(set(res["seen"])) and 0 < len(res["seen"]) and res["seen"][-1] < len(prompts)
    via_engine = vllm_f32.generate(prompts, s, seed=7)
    assert [g.token_ids for g in via_engine] == [r[0] for r in res["generate"]]
    assert [g.logprobs for g in via_engine] == [r[1] for r in res["generate"]]


@pytest.mark.parametrize("lora", ["adapter", "auto", "delta"])
def test_vllm_lora_adapter_matches_peft_recomputation(tiny_model_dir, tmp_path, lora):
    """vLLM's LoRA layers (``adapter``), the adapter merged into the weights (``auto`` on the CPU
    = ``merged``) and the factors applied beside vLLM's fused layers by the worker's
    hooks (``delta``: q/k/v inside ``qkv_proj``, gate/up inside ``gate_up_proj``) all give the
    peft model's float32 log-probs; the merged copy is removed on close."""
    require_vllm_venv()
    from tasks.rollout.engines import make_policy

    adapter = make_lora_adapter(tiny_model_dir, tmp_path / "adapter")
    cfg = PolicyConfig(model=str(tiny_model_dir), engine="vllm", rollout_dtype="float32", vllm={"lora": lora})
    base, ref = reference_model(tiny_model_dir), reference_model(tiny_model_dir, adapter)
    with make_policy(tiny_model_dir, cfg, base_model_id="tiny", adapter_dir=adapter) as pol:
        assert pol.policy_id == f"tiny+{pol.adapter_sha256[:12]}" and len(pol.adapter_sha256) == 64
        merged = pol._merged_dir
        assert pol.lora_mode == ("merged" if lora == "auto" else lora)
        assert (merged is None) == (lora != "auto") and pol.delta_loaded == (lora == "delta")
        if merged is not None:
            assert Path(merged, "model.safetensors").is_file() and pol.adapter_dir is None
        if lora == "delta":  # served: the base model's folder, no vLLM LoRA
            assert pol.worker_config["model"] == str(tiny_model_dir.resolve()) and pol.adapter_dir is None
            assert pol.worker_config["max_lora_rank"] is None
        worker = pol._worker.proc
        for s in SAMPLINGS:
            prompts = prompts_for(pol.tokenizer)
            for p, g in zip(prompts, pol.generate(prompts, s, seed=5)):
                lp = torch.tensor(g.logprobs)
                assert (recompute(ref, p, g.token_ids, s) - lp).abs().max().item() < F32_TOL
                # the adapter is applied: the base model gives these tokens other log-probs
                assert (recompute(base, p, g.token_ids, s) - lp).abs().max().item() > 0.05
    # closed: the worker and its process group are gone, and the merged weights
    assert merged is None or not Path(merged).exists()
    assert worker.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(worker.pid, 0)
    with pytest.raises(Exception, match="not running"):
        pol.generate([[1, 2]], SAMPLINGS[0], seed=0)


def test_vllm_missing_venv_is_a_clear_error(tiny_model_dir, tmp_path):
    from tasks.rollout.engines.base import EngineError
    from tasks.rollout.engines.vllm_engine import VLLMPolicy

    cfg = PolicyConfig(model=str(tiny_model_dir), engine="vllm", vllm={"venv": str(tmp_path / "nope")})
    with pytest.raises(EngineError, match="setup-vllm.sh"):
        VLLMPolicy(tiny_model_dir, cfg, base_model_id="tiny")


def test_policy_config_engine_fields_are_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="engine"):
        PolicyConfig(engine="sglang")
    with pytest.raises(ValidationError, match="policy.openai section"):
        PolicyConfig(engine="openai")
    with pytest.raises(ValidationError, match="base_url"):
        PolicyConfig(engine="openai", openai={"base_url": "localhost:8000", "model": "m"})
    with pytest.raises(ValidationError, match="max_concurrency"):
        PolicyConfig(engine="openai", openai={"base_url": "http://x/v1", "model": "m", "max_concurrency": 0})
    with pytest.raises(ValidationError, match="kv_cache_gib"):
        PolicyConfig(engine="vllm", vllm={"kv_cache_gib": 0})
    with pytest.raises(ValidationError, match="extra"):
        PolicyConfig(engine="vllm", vllm={"max_len": 5})
    with pytest.raises(ValidationError, match="lora"):
        PolicyConfig(engine="vllm", vllm={"lora": "fused"})
    ok = PolicyConfig(engine="openai", openai={"base_url": "http://127.0.0.1:8000/v1", "model": "m"})
    assert ok.openai.max_concurrency == 8 and ok.openai.api_key_env is None

