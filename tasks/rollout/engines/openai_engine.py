"""The ``openai`` engine: any OpenAI-compatible completions server that returns token ids and
the sampler's processed log-probs, through the official ``openai`` client (optional extra
``openai``: ``pip install -e .[openai]``).

One completions request per prompt, the prompt given as token ids, with its own seed:
``logprobs=0`` (the sampled token's log-prob only), and vLLM's request extensions in the body:
``top_k``, ``return_token_ids`` (the completion's ids), ``return_tokens_as_token_ids`` (log-prob
tokens as ``token_id:N``, cross-checked against the ids), ``stop_token_ids`` = [EOS],
``min_p`` 0, ``repetition_penalty`` 1. Up to ``policy.openai.max_concurrency`` requests are in
flight (a thread pool; the client's own retries and timeout apply to each).

Several servers (``policy.openai.base_urls``, all serving the same model): each request goes to
the next server in rotation. A server that fails a request with a connection error or a 5xx
status after the client's retries is taken out of rotation for the rest of the policy's life
(a warning names it and the reason; :attr:`OpenAIPolicy.out_of_rotation` keeps the reasons) and
the request is sent to the next live server. A request's completion depends only on (weights,
prompt, sampling, seed), so which server answered does not change the rollout on a server that
honours seeds. With no live server left, :class:`EngineError` lists every server's reason.

The server must report processed log-probs and stop only at the tokenizer's EOS: for
``vllm serve`` that is ``--logprobs-mode processed_logprobs --generation-config vllm``; with the
default ``raw_logprobs`` the returned values ignore temperature/top-k/top-p and importance ratios
computed from them are wrong. A LoRA adapter is loaded into the server at start through vLLM's
``POST /v1/load_lora_adapter`` (server started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the server must see ``adapter_dir`` at the same path)
and requested by the name ``harnessrl-<adapter sha256[:16]>``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasks.config import PolicyConfig
from tasks.harnesses.spec import SamplingSpec
from tasks.hashing import seed_from
from tasks.rollout.engines.base import EngineError, load_tokenizer, policy_identity, to_generation
from tasks.rollout.generation import Generation

# OpenAI's completions API takes a 32-bit seed; vLLM accepts any int, other servers may not
SEED_MOD = 2**31

log = logging.getLogger("harnessrl.rollout")


class OpenAIPolicy:
    """A rollout policy sampled by an OpenAI-compatible completions server.

    Args:
        model_dir: the local model folder whose tokenizer the server's model uses (prompts are
            sent as token ids; completions are decoded here).
        cfg: the run's policy config; ``cfg.openai`` holds ``base_url`` or ``base_urls``,
            ``model``, ``api_key_env``, ``timeout_s``, ``max_retries``, ``max_concurrency``.
        base_model_id: id of the base model (recorded in every episode's ``policy_id``).
        adapter_dir: a peft LoRA adapter folder to load into the server, or None.

    Raises:
        EngineError: the ``openai`` package is missing, ``api_key_env`` names an unset variable,
            a server refused the adapter, or no server could load it.
    """

    def __init__(self, model_dir: Path, cfg: PolicyConfig, *, base_model_id: str, adapter_dir: Path | None = None):
        try:
            import openai
        except ImportError:
            raise EngineError("policy.engine='openai' needs the openai client: pip install -e '.[openai]'") from None
        if cfg.openai is None:
            raise EngineError("policy.engine='openai' needs a policy.openai section (base_url, model)")
        oc = cfg.openai
        self.cfg = cfg
        self.tokenizer = load_tokenizer(Path(model_dir))
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.base_model_id = base_model_id
        self.policy_id, self.adapter_sha256 = policy_identity(base_model_id, adapter_dir)
        if oc.api_key_env is not None:
            key = os.environ.get(oc.api_key_env)
            if not key:
                raise EngineError(f"policy.openai.api_key_env={oc.api_key_env!r}: that environment variable is not set")
        else:
            key = "EMPTY"
        self.urls = oc.urls()
        self.clients = {u: openai.OpenAI(base_url=u, api_key=key, timeout=oc.timeout_s, max_retries=oc.max_retries)
                        for u in self.urls}
        self.client = self.clients[self.urls[0]]  # the first server's client (one-server callers)
        self.out_of_rotation: dict[str, str] = {}  # server URL -> why it was taken out
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self.model = oc.model
        if adapter_dir is not None:
            self.model = f"harnessrl-{self.adapter_sha256[:16]}"
            for u in self.urls:
                self._load_adapter(u, Path(adapter_dir).resolve())
            self._live()  # raises when no server could load it

    def _load_adapter(self, url: str, path: Path) -> None:
        import openai

        try:
            self.clients[url].post("/load_lora_adapter", body={"lora_name": self.model, "lora_path": str(path)},
                                   cast_to=str)
        except openai.APIStatusError as e:
            if "already" in str(e).lower():  # same name = same adapter bytes (the name is their hash)
                return
            if e.status_code >= 500:
                self._take_out(url, e)
                return
            raise EngineError(f"openai server at {url} refused LoRA adapter {path}: {e} "
                              "(vllm serve needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)") from None
        except openai.APIConnectionError as e:
            self._take_out(url, e)

    def _take_out(self, url: str, err: BaseException) -> None:
        with self._lock:
            if url in self.out_of_rotation:
                return
            self.out_of_rotation[url] = f"{type(err).__name__}: {err}"
            left = len(self.urls) - len(self.out_of_rotation)
        log.warning("openai server %s taken out of rotation (%d of %d left): %s: %s", url, left, len(self.urls),
                    type(err).__name__, err)

    def _live(self) -> list[str]:
        with self._lock:
            live = [u for u in self.urls if u not in self.out_of_rotation]
        if not live:
            reasons = "; ".join(f"{u}: {why}" for u, why in self.out_of_rotation.items())
            raise EngineError(f"policy.openai: none of the {len(self.urls)} server(s) is left in rotation ({reasons})")
        return live

    def _next_server(self) -> str:
        live = self._live()
        return live[next(self._turn) % len(live)]

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Generation]:
        """Sample one completion per prompt (token-id lists); prompt ``i`` gets the seed
        ``seed_from(seed, i) mod 2**31``, so with a server that honours seeds (vLLM does) the
        result depends on (weights, prompts, sampling, seed) only. Each completed request is
        reported to :func:`tasks.progress.requests_done` as it arrives.

        Raises:
            EngineError: a response without token ids or log-probs, log-prob tokens that are not
                the returned ids, a completion that breaks the ``Generation`` contract, or no
                server left in rotation.
            openai.APIError: a server refused the request (a 4xx status: the request's fault,
                not the server's; it is not sent elsewhere).
        """
        if not prompts:
            return []
        jobs = [(p, seed_from(seed, i) % SEED_MOD) for i, p in enumerate(prompts)]
        from concurrent.futures import as_completed

        from tasks.progress import requests_done

        with ThreadPoolExecutor(max_workers=min(self.cfg.openai.max_concurrency, len(jobs))) as pool:
            futures = [pool.submit(self._one, p, sampling, s) for p, s in jobs]
            for f in as_completed(futures):  # progress as requests complete, here in the caller's thread
                if f.exception() is None:
                    requests_done(1)
            return [f.result() for f in futures]

    def _one(self, prompt: list[int], sampling: SamplingSpec, seed: int) -> Generation:
        """One request, on the next live server; on a server failure (connection error, 5xx after
        the client's retries) that server leaves the rotation and the next one is asked."""
        import openai

        for _ in self.urls:  # each failure takes one server out: at most one try per server
            url = self._next_server()
            try:
                return self._request(url, prompt, sampling, seed)
            except (openai.APIConnectionError, openai.InternalServerError) as e:
                self._take_out(url, e)
        self._live()  # raises: every server failed
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(self, url: str, prompt: list[int], sampling: SamplingSpec, seed: int) -> Generation:
        resp = self.clients[url].completions.create(
            model=self.model, prompt=[int(t) for t in prompt], max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature, top_p=sampling.top_p, seed=seed, logprobs=0, n=1,
            extra_body={"top_k": sampling.top_k, "min_p": 0.0, "repetition_penalty": 1.0,
                        "stop_token_ids": [self.eos_id], "return_token_ids": True,
                        "return_tokens_as_token_ids": True, "skip_special_tokens": False},
        )
        choice = resp.choices[0]
        extra = choice.model_extra or {}
        ids = extra.get("token_ids")
        lp = choice.logprobs
        if ids is None or lp is None or lp.token_logprobs is None or lp.tokens is None:
            raise EngineError(f"openai server at {url} returned no token ids or log-probs "
                              "(it must support return_token_ids and logprobs, as vllm serve does)")
        named = [int(t.split(":", 1)[1]) if t.startswith("token_id:") else None for t in lp.tokens]
        if named != [int(i) for i in ids]:
            raise EngineError(f"openai server at {url}: log-prob tokens {lp.tokens[:5]} do not match token ids "
                              f"{ids[:5]}")
        return to_generation("openai", ids, [float(x) for x in lp.token_logprobs], choice.finish_reason,
                             self.eos_id, sampling.max_new_tokens, self.tokenizer)

    def close(self) -> None:
        """Close every server's client connections. Idempotent."""
        for c in self.clients.values():
            c.close()

    def __enter__(self) -> "OpenAIPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
