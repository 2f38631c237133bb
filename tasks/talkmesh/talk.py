"""The LM side of TalkMesh: prompts, proposals, the talk policy (hints and revisions) on any
policy engine, and the talk policy's GRPO batch.

Every call goes through a policy engine's ``generate(prompts, sampling, seed)`` (hf, vllm or
openai; :func:`tasks.rollout.engines.load_policy`) with chat prompts built by
:class:`tasks.rollout.generation.ChatFormat`; answers are parsed with the harness's answer pattern
(:func:`tasks.harnesses.actions.parse_reply`, then its fallback).

Talk GRPO (P3: docs/methods/p3-talkmesh.md): a revision's reward is R = 1[revision correct] - 1[proposal correct]
(in {-1, 0, 1}); a hint's reward is the mean R of the revisions it caused. Advantages are
normalised within each problem (one group per (problem, kind)) by the trainer's GRPO
(:func:`tasks.train.advantages.group_advantages`), which takes rewards of any scale.
"""

from __future__ import annotations

from typing import Any, Sequence

from tasks.harnesses.spec import HarnessSpec, SamplingSpec
from tasks.talkmesh.mesh import Output, Problem
from tasks.train.sequences import TrainSequence

HINT_SYSTEM = ("You are one of several students solving the same math problem. Write a short hint (one or two "
               "sentences) that helps the others find the right answer, and state your answer.")
HINT_USER = "Problem:\n{question}\n\nYour solution:\n{solution}\n\nYour hint:"
REVISE_USER = ("{question}\n\nYour earlier solution:\n{solution}\n\nA hint from another student:\n{hint}\n\n"
               "Check your work with the hint and solve again. End with a line of the form \"Answer: <number>\".")


def parse_answer(spec: HarnessSpec, text: str) -> str | None:
    """The answer in ``text`` under the harness's answer pattern, else its fallback (None if neither)."""
    from tasks.harnesses.actions import fallback_answer, parse_reply

    ans = parse_reply(spec, text).answer
    return ans if ans is not None else fallback_answer(spec, text)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + " ..."


class LMTalk:
    """Proposals, hints and revisions from one policy engine (the talk policy: the base model, or
    the base model with the trained talk adapter).

    Args:
        policy: an engine with ``generate`` and ``tokenizer``.
        spec: the harness whose system prompt and answer pattern the agents use.
        proposal_sampling / talk_sampling: samplers of proposals and of hints and revisions.
        max_solution_chars: a solution quoted in a hint or revision prompt is cut to this length.
    """

    def __init__(self, policy: Any, spec: HarnessSpec, proposal_sampling: SamplingSpec, talk_sampling: SamplingSpec,
                 max_solution_chars: int = 600):
        from tasks.rollout.generation import ChatFormat

        self.policy, self.spec = policy, spec
        self.chat = ChatFormat(policy.tokenizer)
        self.proposal_sampling, self.talk_sampling = proposal_sampling, talk_sampling
        self.max_chars = max_solution_chars

    def _run(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Output]:
        gens = self.policy.generate(prompts, sampling, seed) if prompts else []
        return [Output(g.text, parse_answer(self.spec, g.text), tuple(p), tuple(g.token_ids), tuple(g.logprobs))
                for p, g in zip(prompts, gens)]

    def proposal_prompt(self, p: Problem) -> list[int]:
        """Chat prompt ids: the harness's system prompt and instance template for ``p``."""
        return self.chat.initial(self.spec.system_prompt, self.spec.instance_template.format(instruction=p.question))

    def propose(self, problems: Sequence[Problem], k: int, seed: int) -> list[list[Output]]:
        """``[P][k]`` proposals in one engine call whose prompt ``j * P + i`` is sample j of
        problem i (engines seed each prompt by its index, e.g. vLLM's ``seed_from(seed, index)``,
        so with vLLM the first N of k samples are the same for any k >= N)."""
        prompts = [self.proposal_prompt(p) for p in problems]
        flat = self._run(prompts * k, self.proposal_sampling, seed)
        n = len(problems)
        return [[flat[j * n + i] for j in range(k)] for i in range(n)]

    def hints(self, items: Sequence[tuple[Problem, Output]], seed: int) -> list[Output]:
        prompts = [self.chat.initial(HINT_SYSTEM, HINT_USER.format(question=p.question,
                                                                    solution=_clip(o.text, self.max_chars)))
                   for p, o in items]
        outs = self._run(prompts, self.talk_sampling, seed)
        # a hint states the source's answer: the one its solution reached (parsed from the solution)
        return [Output(h.text, o.answer, h.prompt_ids, h.token_ids, h.logprobs) for h, (_, o) in zip(outs, items)]

    def revise(self, items: Sequence[tuple[Problem, Output, str]], seed: int) -> list[Output]:
        prompts = [self.chat.initial(self.spec.system_prompt, REVISE_USER.format(
            question=p.question, solution=_clip(o.text, self.max_chars), hint=h)) for p, o, h in items]
        return self._run(prompts, self.talk_sampling, seed)


def revision_reward(proposal_correct: bool, revision_correct: bool) -> float:
    """R = 1[revision correct] - 1[proposal correct]."""
    return float(revision_correct) - float(proposal_correct)


def talk_sequences(revisions: Sequence[dict[str, Any]], sampling: SamplingSpec
                   ) -> tuple[list[TrainSequence], list[dict[str, Any]]]:
    """The talk policy's GRPO batch from :attr:`tasks.talkmesh.mesh.MeshResult.revisions`.

    One sequence per revision (reward :func:`revision_reward`; group ``problem|revision``) and one
    per distinct model-written hint (reward = the mean R of its revisions; group ``problem|hint``).
    A sequence is the call's prompt ids (mask 0) followed by the completion ids (mask 1, with the
    sampler's log-probs as behaviour log-probs). Scripted messages (no token ids, e.g. poisoned
    hints) are skipped. Groups go to the trainer as ``task_id`` = problem id, ``harness_id`` =
    ``talkmesh-<kind>``, so ``train.grouping: within`` normalises per problem and kind.

    Returns ``(sequences, rows)``: rows for the ``talkmesh_talk_sequences`` table.
    """
    key = (sampling.temperature, sampling.top_k, sampling.top_p)
    seqs: list[TrainSequence] = []
    rows: list[dict[str, Any]] = []

    def add(pid: str, kind: str, out: Output, reward: float, n: int) -> None:
        ids = list(out.prompt_ids) + list(out.token_ids)
        mask = [0] * len(out.prompt_ids) + [1] * len(out.token_ids)
        logp = [0.0] * len(out.prompt_ids) + list(out.logprobs)
        seqs.append(TrainSequence(episode_id=f"{pid}|{kind}|{n}", ids=ids, mask=mask, behaviour_logp=logp,
                                  reward=reward, task_id=pid, task_hash=pid, harness_id=f"talkmesh-{kind}",
                                  sampling_key=key))
        rows.append({"problem_id": pid, "kind": kind, "group": f"{pid}|{kind}", "reward": reward,
                     "tokens": len(out.token_ids), "text": out.text})

    hint_rewards: dict[tuple[str, Output], list[float]] = {}
    for n, r in enumerate(revisions):
        pid = r["problem"].problem_id
        rew = revision_reward(r["proposal_correct"], r["revision_correct"])
        if r["revision"].token_ids:
            add(pid, "revision", r["revision"], rew, n)
        if r["hint"].token_ids:
            hint_rewards.setdefault((pid, r["hint"]), []).append(rew)
    for n, ((pid, hint), rs) in enumerate(hint_rewards.items()):
        add(pid, "hint", hint, sum(rs) / len(rs), n)
    return seqs, rows
