"""What every policy engine shares: the interface (:class:`PolicyEngine`, and
:class:`WeightSyncEngine` for the engines online training updates in place), policy identity, the
tokenizer, and a check that an engine's completion obeys the ``Generation`` contract. Which engine
can do what is the registry's (:data:`tasks.config.engines.ENGINES`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tasks.harnesses.spec import SamplingSpec
from tasks.rollout.generation import Generation


class EngineError(RuntimeError):
    """A policy engine that cannot start or answer; the message says which engine and why."""


@runtime_checkable
class PolicyEngine(Protocol):
    """What the harness engine needs from a policy, and how to let it go.

    Attributes:
        tokenizer: a transformers tokenizer; the harness builds prompts as token ids with it.
        policy_id: ``base_model_id`` or ``base_model_id+<first 12 hex of adapter_sha256>``.
        base_model_id: :func:`tasks.rollout.models.model_id` of the base model folder.
        adapter_sha256: :func:`tasks.hashing.sha256_dir` of the LoRA adapter folder, ``""`` without one.
    """

    tokenizer: Any
    policy_id: str
    base_model_id: str
    adapter_sha256: str

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Generation]:
        """One completion per prompt (token-id lists), in prompt order. Each ``Generation`` holds the
        completion's token ids cut after the first EOS (kept; ``finish_reason`` ``stop``) or at
        ``sampling.max_new_tokens`` (``length``), and one float log-prob (nats) per token under the
        processed sampling distribution (temperature, then top-k, then top-p), i.e. what
        :func:`tasks.train.logprobs.token_logprobs` recomputes on the same weights."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a worker process, connections, temporary weights).
        Idempotent; the engine generates nothing after it."""
        ...


@runtime_checkable
class WeightSyncEngine(PolicyEngine, Protocol):
    """A policy engine that online training updates in place (registry ``online: in_place``;
    :class:`tasks.train.online.EngineSampler`): started once on the base model, it takes the
    trainer's weights after each batch and scores a probe to show it did."""

    def load_weights(self, state: dict[str, Any]) -> dict[str, float]:
        """Load ``state`` (``{checkpoint name: tensor}``, the trainer's merged weights from
        :meth:`tasks.train.trainer.Trainer.merged_state`) into the running engine in place; names
        absent from ``state`` keep their weights. Returns ``{"seconds", "names"}`` (load time,
        tensors loaded). Raises EngineError when the engine cannot load them."""
        ...

    def load_adapter(self, tensors: dict[str, Any], scale: float) -> dict[str, float]:
        """Serve the LoRA factors ``tensors`` (peft names, from
        :meth:`tasks.train.trainer.Trainer.adapter_state`) at ``scale`` beside the base weights,
        replacing the factors of an earlier call in place (adapter-only sync, ``policy.vllm.lora:
        delta``). Returns ``{"seconds", "names", "bytes", ...}``. Raises EngineError when the
        engine cannot apply them."""
        ...

    def score(self, prompts: list[list[int]]) -> list[list[float]]:
        """Log-probs (nats, temperature 1, no top-k/top-p) of every token after the first of each
        token-id list under the current weights: ``len(p) - 1`` floats per prompt."""
        ...


def policy_identity(base_model_id: str, adapter_dir: Path | None) -> tuple[str, str]:
    """``(policy_id, adapter_sha256)`` for a base model and an optional adapter folder, the same
    formula as :class:`tasks.rollout.engines.hf.HFPolicy`."""
    if adapter_dir is None:
        return base_model_id, ""
    from tasks.hashing import sha256_dir

    sha = sha256_dir(Path(adapter_dir))
    return f"{base_model_id}+{sha[:12]}", sha


def load_tokenizer(model_dir: Path) -> Any:
    """The model folder's tokenizer, set up as :func:`tasks.rollout.models.load_model_and_tokenizer`
    sets it up (left padding; EOS as the pad token when the tokenizer has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def to_generation(engine: str, tokens: list[int], logprobs: list[float], finish_reason: str, eos_id: int,
                  max_new_tokens: int, tokenizer: Any) -> Generation:
    """Check one engine completion against the contract and trim it like the transformers engine.

    Raises:
        EngineError: a log-prob count that differs from the token count, a log-prob that is not a
            finite number <= 0 (a token outside the top-k/top-p support cannot have been sampled),
            more than ``max_new_tokens`` tokens, or a ``stop`` that did not end on ``eos_id``
            (a server stopping on other ids would cut completions the trainer treats as unfinished).
    """
    import math

    from tasks.rollout.generation import trim_completion

    if len(tokens) != len(logprobs):
        raise EngineError(f"{engine}: {len(logprobs)} log-probs for {len(tokens)} tokens")
    if len(tokens) > max_new_tokens:
        raise EngineError(f"{engine}: {len(tokens)} tokens returned, max_new_tokens is {max_new_tokens}")
    bad = [x for x in logprobs if not (math.isfinite(x) and x <= 1e-6)]
    if bad:
        raise EngineError(f"{engine}: log-probs must be finite and <= 0, got {bad[:3]}")
    toks, lps, finish = trim_completion([int(t) for t in tokens], [float(x) for x in logprobs], eos_id)
    if finish_reason == "stop" and finish != "stop":
        raise EngineError(f"{engine}: finished 'stop' on token {tokens[-1] if tokens else None}, not EOS {eos_id}: "
                          "the engine stops on ids other than the tokenizer's EOS")
    return Generation(token_ids=toks, logprobs=lps, finish_reason=finish,
                      text=tokenizer.decode(toks, skip_special_tokens=True))
