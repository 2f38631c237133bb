"""Turn rows -> one training sequence per episode, with the loss mask and behaviour log-probs.

The sequence of an episode is its last turn's prompt plus that turn's completion, chained from the
turns by :func:`tasks.rollout.turns.episode_sequence` (each turn stores what its prompt adds to the
previous prompt + completion), so every completion sits at a known offset. Tokens the policy generated get mask 1; system, instruction, observation and
tool-output tokens get mask 0 and so stay out of every loss sum and denominator.

Which episodes train (:func:`build_sequences`): every episode keeps its place in its group,
whatever its ``stop_reason`` (``tasks.rollout.harness.STOP_REASONS``), except infrastructure
errors (the environment failed, not the policy: no reward to learn from) and the stop reasons a
user drops on purpose (``train.drop_stop_reasons``). Episodes cut by the harness's limits
(``timeout``, ``max_tokens``) are scored 0 unless ``train.truncated_reward`` is ``graded``:
dropping them would remove exactly the long, slow trajectories from the group baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass
class TrainSequence:
    """One episode as a training sample. ``ids``, ``mask``, ``behaviour_logp``: length L lists;
    ``behaviour_logp[p]`` is the sampler's log-prob of ``ids[p]`` (0.0 where mask is 0)."""

    episode_id: str
    ids: list[int]
    mask: list[int]
    behaviour_logp: list[float]
    reward: float
    task_id: str
    task_hash: str
    harness_id: str
    sampling_key: tuple[float, int, float]  # (temperature, top_k, top_p)
    stop_reason: str = "submitted"
    policy_version: int = 0  # the policy version that sampled it (staleness = trainer version - this)


class SequenceError(ValueError):
    """Turn rows that do not form a consistent episode (the message names the episode and turn)."""


CUT_STOP_REASONS = ("timeout", "max_tokens")


def build_sequences(episodes: Iterable[dict[str, Any]], turns: Iterable[dict[str, Any]],
                    sampling_by_harness: dict[str, tuple[float, int, float]], *,
                    drop_stop_reasons: Iterable[str] = (), truncated_reward: str = "zero"
                    ) -> tuple[list[TrainSequence], dict[str, int]]:
    """One :class:`TrainSequence` per training episode, in episode order, and the rows left out.

    Args:
        episodes: ``episodes`` rows (``stop_reason``, ``reward``, ``policy_version`` ...).
        turns: their ``turns`` rows.
        sampling_by_harness: harness_id -> (temperature, top_k, top_p) of its sampler.
        drop_stop_reasons: stop reasons left out on purpose (``train.drop_stop_reasons``).
        truncated_reward: ``zero`` (an episode whose stop reason is in :data:`CUT_STOP_REASONS`
            gets reward 0.0 in its group) or ``graded`` (the verifier's reward as it is).

    Returns:
        ``(sequences, dropped)``: ``dropped`` maps each rule to the number of episodes it left
        out (``infra_error`` always; each dropped stop reason), zero counts omitted.

    Raises:
        SequenceError: an episode with no turns, or turns that do not chain into one sequence
            (a gap in ``turn_idx``, a later turn that does not continue the previous one); an
            episode of a plugged-in loop type whose turns are separate messages (``talkmesh``:
            its plugin's ``train_sequences`` builds its sequences).
    """
    from tasks.rollout.turns import TurnsError, episode_sequence
    from tasks.rollout.loop_plugins import owns_turn

    if truncated_reward not in ("zero", "graded"):
        raise ValueError(f"truncated_reward={truncated_reward!r} is not one of 'zero', 'graded'")
    drop = set(drop_stop_reasons)
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    out = []
    dropped: dict[str, int] = {}
    for ep in episodes:
        reason = ep["stop_reason"]
        if reason == "infra_error" or ep["status"] == "infra_error":
            dropped["infra_error"] = dropped.get("infra_error", 0) + 1
            continue
        if reason in drop:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        ts = sorted(by_ep.get(ep["episode_id"], []), key=lambda t: t["turn_idx"])
        if not ts:
            raise SequenceError(f"episode {ep['episode_id']} has no turns")
        owner = next((p for p in (owns_turn(t.get("action")) for t in ts) if p is not None), None)
        if owner is not None:
            raise SequenceError(
                f"episode {ep['episode_id']} (harness {ep.get('harness_name', ep['harness_id'])}) is a {owner.loop_type} "
                "run: its turns are separate messages with their own prompts, not one growing context, and cannot be "
                f"chained into one sequence; train it with the {owner.loop_type} plugin's train_sequences")
        try:  # the prompt reconstruction: turns store what they add (tasks.rollout.turns)
            ids, starts = episode_sequence(ts)
        except TurnsError as e:
            raise SequenceError(str(e)) from None
        mask = [0] * len(ids)
        logp = [0.0] * len(ids)
        for t, start in zip(ts, starts):
            comp = list(t["completion_token_ids"])
            lm, lp = list(t["loss_mask"]), list(t["completion_logprobs"])
            if not (len(lm) == len(lp) == len(comp)):
                raise SequenceError(f"episode {ep['episode_id']} turn {t['turn_idx']}: mask/logprob/token lengths differ")
            mask[start:start + len(comp)] = lm
            logp[start:start + len(comp)] = [x if m else 0.0 for x, m in zip(lp, lm)]
        reward = 0.0 if (truncated_reward == "zero" and reason in CUT_STOP_REASONS) else float(ep["reward"])
        out.append(TrainSequence(
            episode_id=ep["episode_id"], ids=ids, mask=mask, behaviour_logp=logp, reward=reward,
            task_id=ep["task_id"], task_hash=ep["task_hash"], harness_id=ep["harness_id"],
            sampling_key=sampling_by_harness[ep["harness_id"]], stop_reason=reason,
            policy_version=int(ep.get("policy_version", 0)),
        ))
    return out, dropped
