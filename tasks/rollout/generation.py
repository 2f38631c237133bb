"""What every policy engine returns and how prompts are built: :class:`Generation` (a completion with
its token ids and the sampler's log-probs), :func:`trim_completion` (the cut at the first EOS) and
:class:`ChatFormat` (chat-template prompts as token ids). The engines themselves are in
:mod:`tasks.rollout.engines`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Generation:
    """One completion: ``token_ids`` (ends with EOS when ``finish_reason == "stop"``),
    ``logprobs`` (float, nats, one per token, under the processed sampling distribution).
    ``state``: what an engine that takes ``states`` (the ``hf`` engine) keeps of this row for the
    episode's next turn when asked to (``keep_states``), else None; never stored in an artifact."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str
    state: Any = field(default=None, compare=False, repr=False)


def trim_completion(tokens: list[int], logprobs: list[float], eos_id: int) -> tuple[list[int], list[float], str]:
    """Cut a generated row at its first EOS (kept, finish ``stop``); without an EOS keep every
    token (finish ``length``). Whatever follows the first EOS is padding, which may use the EOS id
    itself (SmolLM2's pad id is its EOS id), and is dropped with its log-probs."""
    if eos_id in tokens:
        n = tokens.index(eos_id) + 1
        return tokens[:n], [float(x) for x in logprobs[:n]], "stop"
    return list(tokens), [float(x) for x in logprobs], "length"


class ChatFormat:
    """Token-exact multi-turn prompts from the tokenizer's chat template.

    The first prompt is the template applied to (system, user). Every later observation is
    appended as the template's "user message after an assistant turn" piece, tokenised alone, so
    turn t+1's prompt ids = turn t's prompt ids + completion ids (+ EOS if the completion was cut)
    + observation ids, with no re-tokenisation of earlier text.
    """

    _A, _O = "\u2063A\u2063", "\u2063O\u2063"

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        eos = tokenizer.eos_token
        full = tokenizer.apply_chat_template(
            [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
             {"role": "assistant", "content": self._A}, {"role": "user", "content": self._O}],
            tokenize=False, add_generation_prompt=True,
        )
        after = full[full.index(self._A) + len(self._A):]
        before_obs, after_obs = after.split(self._O)
        if not before_obs.startswith(eos):
            raise ValueError(f"chat template does not close an assistant turn with EOS {eos!r}: {before_obs[:40]!r}")
        self._pre, self._post = before_obs[len(eos):], after_obs

    def initial(self, system: str, user: str, demonstrations: list[dict[str, str]] | None = None) -> list[int]:
        """The first prompt's token ids: the chat template applied to the system turn, the
        ``demonstrations`` (earlier ``{"role": "user" | "assistant", "content": ...}`` turns, a
        harness's few-shot examples, :meth:`tasks.harnesses.spec.HarnessSpec.chat_messages`) and
        the task's user turn, with the assistant turn opened. Returns a list of int."""
        ids = self.tok.apply_chat_template(
            [{"role": "system", "content": system}, *(demonstrations or []), {"role": "user", "content": user}],
            tokenize=True, add_generation_prompt=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(x) for x in ids]

    def continuation(self, completion_ids: list[int], observation: str) -> list[int]:
        """Ids appended after a completion to add ``observation`` and open the next assistant turn."""
        closing = [] if completion_ids and completion_ids[-1] == self.eos_id else [self.eos_id]
        return closing + self.tok.encode(self._pre + observation + self._post, add_special_tokens=False)
