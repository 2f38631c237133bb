"""The ``openai`` engine against a real ``vllm serve`` (from .venv-vllm) on the tiny model.

The server runs in bfloat16, the default rollout dtype, and the trainer recomputes in float32:
bf16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 0.002 per stored weight and activation), and
the tiny model's logits are O(1), so its processed log-probs differ from the float32 ones by a
few 1e-3 nats (measured max 0.003 at temperature 1 untruncated). Tolerance 0.02 there: still an
order of magnitude below what a processing mismatch gives (raw instead of processed log-probs or a
missing temperature: > 0.05 here). Under top-k/top-p the bf16 rounding can also move a token
across the nucleus boundary, which changes the normaliser; those cases are only held to 0.15
(measured max 0.047) and must agree on average within 0.02. A LoRA adapter adds its own bf16-rounded path (B A x):
measured max 0.026, held to 0.06.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from tasks.config import PolicyConfig
from tasks.harnesses.spec import SamplingSpec
from tests.facilities import free_port, require_vllm_venv, stop_process_group
from tests.rollout.test_engines_vllm import SAMPLINGS, make_lora_adapter, prompts_for, recompute, reference_model

BF16_TOL, BF16_TRUNC_TOL, BF16_MEAN_TOL, BF16_LORA_TOL = 0.02, 0.15, 0.02, 0.06
SERVED = "tiny"


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir):
    """``vllm serve`` on 127.0.0.1 and a free port, bf16, processed log-probs, runtime LoRA loading;
    yields its base URL and is stopped (its whole process group) afterwards."""
    py = require_vllm_venv()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    log = tempfile.NamedTemporaryFile(prefix="vllm-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        # the api_server module is what `vllm serve` runs; the `vllm` CLI itself looks up the
        # distribution "vllm", which the CPU build names "vllm-cpu"
        [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir), "--served-model-name", SERVED,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
         "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
         "--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tempfile.gettempdir())
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 240
        while True:  # readiness: /v1/models answers once the engine has loaded
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}):\n{Path(log.name).read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{base}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve not ready in 240 s:\n{Path(log.name).read_text()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        stop_process_group(proc, 30)
        os.unlink(log.name)


def _cfg(model_dir: Path, base: str, **kw) -> PolicyConfig:
    return PolicyConfig(model=str(model_dir), engine="openai", openai={"base_url": base, "model": SERVED, **kw})


def _check(pol, ref, s: SamplingSpec, seed: int) -> tuple[float, float, int, int]:
    """``(max, mean, outside, tokens)``: |server - trainer| log-prob over the sampled tokens the
    trainer's truncated support holds, how many sampled tokens it does not hold (its log-prob is
    -inf: a token at the top-k / top-p boundary that the bf16 server kept and the fp32 trainer cut),
    and the number of tokens."""
    prompts = prompts_for(pol.tokenizer)
    gens = pol.generate(prompts, s, seed=seed)
    assert gens[0].token_ids != gens[2].token_ids  # same prompt, its own seed
    diffs, outside = [], 0
    for p, g in zip(prompts, gens):
        assert 0 < len(g.token_ids) == len(g.logprobs) <= s.max_new_tokens
        assert g.text == pol.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        ours = recompute(ref, p, g.token_ids, s)
        assert torch.isfinite(torch.tensor(g.logprobs)).all()  # the server scores every token it sampled
        held = torch.isfinite(ours)
        outside += int((~held).sum())
        diffs.append((ours[held] - torch.tensor(g.logprobs)[held]).abs())
    d = torch.cat(diffs)
    return d.max().item(), d.mean().item(), outside, sum(len(x) for x in diffs) + outside


def test_openai_engine_logprobs_agree_with_trainer(vllm_server, tiny_model_dir):
    from tasks.rollout.engines import make_policy

    ref = reference_model(tiny_model_dir)
    with make_policy(tiny_model_dir, _cfg(tiny_model_dir, vllm_server, max_concurrency=2), base_model_id="tiny") as pol:
        assert pol.policy_id == "tiny" and pol.adapter_sha256 == ""
        for s in SAMPLINGS:
            mx, mean, outside, n = _check(pol, ref, s, seed=3)
            print(f"bf16 server vs fp32 trainer, {s}: max {mx:.4f} mean {mean:.4f}, {outside}/{n} sampled tokens "
                  "outside the trainer's truncated support")
            truncated = bool(s.top_k) or s.top_p < 1.0
            assert mx < (BF16_TRUNC_TOL if truncated else BF16_TOL) and mean < BF16_MEAN_TOL, (s, mx, mean)
            # without truncation every token has a finite log-prob; with it, bf16 rounding can move a
            # token across the top-p boundary: at most one such token in the batch
            assert outside <= (1 if truncated else 0), (s, outside, n)
        a = pol.generate(prompts_for(pol.tokenizer), SAMPLINGS[1], seed=9)
        assert a == pol.generate(prompts_for(pol.tokenizer), SAMPLINGS[1], seed=9)


def test_openai_engine_loads_lora_adapter(vllm_server, tiny_model_dir, tmp_path):
    from tasks.rollout.engines import make_policy

    adapter = make_lora_adapter(tiny_model_dir, tmp_path / "adapter")
    base, ref = reference_model(tiny_model_dir), reference_model(tiny_model_dir, adapter)
    s = SAMPLINGS[0]
    with make_policy(tiny_model_dir, _cfg(tiny_model_dir, vllm_server), base_model_id="tiny", adapter_dir=adapter) as pol:
        assert pol.model == f"harnessrl-{pol.adapter_sha256[:16]}"
        prompts = prompts_for(pol.tokenizer)
        gens = pol.generate(prompts, s, seed=4)
    d_ref = torch.cat([(recompute(ref, p, g.token_ids, s) - torch.tensor(g.logprobs)).abs() for p, g in zip(prompts, gens)])
    d_base = torch.cat([(recompute(base, p, g.token_ids, s) - torch.tensor(g.logprobs)).abs() for p, g in zip(prompts, gens)])
    print(f"bf16 LoRA server vs fp32 peft: max {d_ref.max():.4f} mean {d_ref.mean():.4f}; vs base model: "
          f"max {d_base.max():.4f} mean {d_base.mean():.4f}")
    # the adapter's B.A.x path is rounded to bf16 too (measured max 0.026): held to BF16_LORA_TOL
    assert d_ref.max().item() < BF16_LORA_TOL and d_ref.mean().item() < BF16_MEAN_TOL
    # the adapter is applied: the base model is much further off than bf16 rounding
    assert d_base.mean().item() > 5 * d_ref.mean().item() and d_base.max().item() > 0.1


def test_openai_engine_missing_api_key_variable(tiny_model_dir, monkeypatch):
    from tasks.rollout.engines.base import EngineError
    from tasks.rollout.engines.openai_engine import OpenAIPolicy

    pytest.importorskip("openai")
    monkeypatch.delenv("HARNESSRL_TEST_NO_SUCH_KEY", raising=False)
    cfg = _cfg(tiny_model_dir, "http://127.0.0.1:9/v1", api_key_env="HARNESSRL_TEST_NO_SUCH_KEY")
    with pytest.raises(EngineError, match="HARNESSRL_TEST_NO_SUCH_KEY"):
        OpenAIPolicy(tiny_model_dir, cfg, base_model_id="tiny")


def test_openai_engine_skips_a_dead_server_in_base_urls(vllm_server, tiny_model_dir, caplog):
    """base_urls with a server that is not there and the real vllm serve: the dead one leaves the
    rotation at its first request (reason logged), vllm serve answers everything."""
    import logging

    from tasks.rollout.engines import make_policy

    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = PolicyConfig(model=str(tiny_model_dir), engine="openai",
                       openai={"base_urls": [dead, vllm_server], "model": SERVED, "max_retries": 0})
    ref = reference_model(tiny_model_dir)
    with make_policy(tiny_model_dir, cfg, base_model_id="tiny") as pol, \
            caplog.at_level(logging.WARNING, logger="harnessrl.rollout"):
        mx, mean, outside, _n = _check(pol, ref, SAMPLINGS[0], seed=3)
        assert list(pol.out_of_rotation) == [dead]
    assert mx < BF16_TOL and mean < BF16_MEAN_TOL and outside == 0  # no truncation: every token held
    assert any(dead in r.getMessage() and "taken out of rotation" in r.getMessage() for r in caplog.records)
