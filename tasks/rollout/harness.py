"""The harness engine: one interpreter for every harness spec.

Per episode: render the prompt -> the policy generates -> parse the action -> run the tool in
the episode's sandbox -> observation -> repeat until an answer, or ``max_turns`` -> the verifier
grades the answer (only now does the task's hidden verifier spec come into play).

Episodes of one harness advance in lock-step, one batched ``generate`` call per turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.config import SandboxConfig
from tasks.harnesses.spec import HarnessSpec, SamplingSpec
from tasks.hashing import canonical_json, seed_from, sha256_text
from tasks.records.verifiers import VerifierError, score
from tasks.rollout.policy import ChatFormat, Generation
from tasks.rollout.sandbox import Sandbox, SandboxError, make_sandbox

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CODE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class Policy(Protocol):
    tokenizer: Any

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Generation]: ...


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: the record (task x harness), the task row, and its sample index."""

    episode_id: str
    record: dict[str, Any]
    task: dict[str, Any]
    sample_idx: int
    seed: int


@dataclass
class _Episode:
    job: EpisodeJob
    prompt: list[int]
    instruction_span: dict[str, Any]
    turns: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    done: bool = False
    status: str = "ok"
    sandbox: Sandbox | None = None
    error: str = ""


def clean_number(text: str) -> str:
    return text.strip().rstrip(".").replace(",", "").strip()


def parse_action(spec: HarnessSpec, text: str) -> dict[str, Any]:
    """The action in a completion: ``{"type": "answer", "answer": ...}``, ``{"type": "code",
    "tool": ..., "code": ...}`` or ``{"type": "none"}``. An answer wins over code in the same
    completion (the agent has submitted)."""
    m = re.search(spec.answer_pattern, text)
    if m:
        return {"type": "answer", "answer": clean_number(m.group(1))}
    if spec.action_format == "fenced_code":
        c = _CODE.search(text)
        if c and c.group(1).strip():
            return {"type": "code", "tool": spec.tools[0].name, "code": c.group(1)}
    return {"type": "none"}


def fallback_answer(spec: HarnessSpec, text: str) -> str | None:
    """The answer when the agent never submitted one: the last number of its final completion
    (``answer_fallback: last_number``) or None."""
    if spec.answer_fallback == "last_number":
        nums = _NUMBER.findall(text)
        return clean_number(nums[-1]) if nums else None
    return None


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n...[{len(text) - limit} more characters cut]"


def _run_tool(ep: _Episode, spec: HarnessSpec, action: dict[str, Any], sandbox_cfg: SandboxConfig) -> str:
    tool = next(t for t in spec.tools if t.name == action["tool"])
    if ep.sandbox is None:
        ep.sandbox = make_sandbox(sandbox_cfg)
    ep.sandbox.write_file("main.py", action["code"])
    res = ep.sandbox.exec(["python3", "-I", "main.py"], timeout_s=min(tool.timeout_s, sandbox_cfg.wall_s))
    out = res.combined_output().strip() or "(no output)"
    return _truncate(out, spec.observation_max_chars)


def run_episodes(policy: Policy, spec: HarnessSpec, jobs: list[EpisodeJob], sandbox_cfg: SandboxConfig,
                 *, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``jobs`` (all under harness ``spec``) to completion.

    Returns:
        ``(episodes, turns)`` row dicts: episode fields known to the engine (episode_id, reward,
        success, status, num_turns, input_tokens, output_tokens, final_answer) and full ``turns``
        rows. The caller adds record and policy columns.

    Raises:
        ValueError: a turn's prompt does not extend the previous turn's prompt + completion
            exactly (token accounting drift); the episode would be unusable for training.
    """
    chat = ChatFormat(policy.tokenizer)
    system = spec.render_system()
    eps: list[_Episode] = []
    for job in jobs:
        user = spec.instance_template.format(instruction=job.task["instruction"])
        span = {"source": "instruction", "turn": 0,
                "tokens": len(policy.tokenizer.encode(user, add_special_tokens=False)), "sha256": sha256_text(user)}
        eps.append(_Episode(job=job, prompt=chat.initial(system, user), instruction_span=span))
    base_spans = _initial_spans(policy.tokenizer, spec)
    try:
        for turn in range(spec.max_turns):
            active = [e for e in eps if not e.done]
            if not active:
                break
            turn_seed = seed_from(seed, spec.harness_id, turn, [e.job.episode_id for e in active])
            gens = policy.generate([e.prompt for e in active], spec.sampling, turn_seed)
            turns_left = spec.max_turns - turn - 1
            for e, g in zip(active, gens):
                action = parse_action(spec, g.text)
                observation = ""
                spans = [*base_spans, e.instruction_span] if turn == 0 else []
                if action["type"] == "answer":
                    e.answer, e.done = action["answer"], True
                elif spec.loop_type == "single_turn" or turns_left == 0:
                    e.answer, e.done = fallback_answer(spec, g.text), True
                elif action["type"] == "code":
                    try:
                        out = _run_tool(e, spec, action, sandbox_cfg)
                    except SandboxError as err:
                        e.status, e.error, e.done = "infra_error", str(err), True
                        out = ""
                    observation = spec.observation_template.format(output=out, turns_left=turns_left)
                else:
                    observation = spec.format_error_template.format(turns_left=turns_left)
                e.turns.append({
                    "episode_id": e.job.episode_id,
                    "turn_idx": turn,
                    "prompt_token_ids": list(e.prompt),
                    "completion_token_ids": g.token_ids,
                    "completion_logprobs": g.logprobs,
                    "loss_mask": [1] * len(g.token_ids),
                    "completion_text": g.text,
                    "finish_reason": g.finish_reason,
                    "action": canonical_json(action),
                    "observation": observation,
                    "read_spans": canonical_json(spans),
                })
                if not e.done:
                    cont = chat.continuation(g.token_ids, observation)
                    new_prompt = e.prompt + g.token_ids + cont
                    if new_prompt[: len(e.prompt) + len(g.token_ids)] != e.prompt + g.token_ids:
                        raise ValueError(f"episode {e.job.episode_id}: turn {turn + 1} prompt does not extend turn {turn}")
                    e.prompt = new_prompt
                    e.turns[-1]["read_spans"] = canonical_json(
                        spans + ([{"source": "tool_output", "turn": turn + 1, "tokens": len(cont),
                                   "sha256": sha256_text(observation)}] if action["type"] == "code" else [])
                    )
    finally:
        for e in eps:
            if e.sandbox is not None:
                e.sandbox.cleanup()
    episodes = []
    for e in eps:
        reward = 0.0
        if e.status == "ok":
            try:
                reward = score(e.job.task["verifier_kind"], e.job.task["verifier_spec"], e.answer)
            except VerifierError as err:
                e.status, e.error = "infra_error", str(err)
        episodes.append({
            "episode_id": e.job.episode_id,
            "reward": reward,
            "success": e.status == "ok" and reward >= 1.0,
            "status": e.status,
            "num_turns": len(e.turns),
            "input_tokens": sum(len(t["prompt_token_ids"]) for t in e.turns),
            "output_tokens": sum(len(t["completion_token_ids"]) for t in e.turns),
            "final_answer": e.answer,
        })
    turns = [t for e in eps for t in e.turns]
    return episodes, turns


def _initial_spans(tokenizer: Any, spec: HarnessSpec) -> list[dict[str, Any]]:
    """Read spans of the first prompt: the system prompt, the skill (when the spec has one) and
    each with its token count and the SHA-256 of its text (the instruction's span is per episode)."""

    def span(source: str, text: str) -> dict[str, Any]:
        return {"source": source, "turn": 0, "tokens": len(tokenizer.encode(text, add_special_tokens=False)),
                "sha256": sha256_text(text)}

    spans = [span("system", spec.system_prompt)]
    if spec.skill:
        spans.append(span("skill", spec.skill))
    return spans
