"""Turn rows -> one training sequence per episode, with the loss mask and behaviour log-probs.

The sequence of an episode is its last turn's prompt plus that turn's completion, chained from the
turns by :func:`tasks.rollout.turns.episode_sequence` (each turn stores what its prompt adds to the
previous prompt + completion), so every completion sits at a known offset. Tokens the policy
generated get mask 1; system, instruction, observation and tool-output tokens get mask 0 and so
stay out of every loss sum and denominator.
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


class SequenceError(ValueError):
    """Turn rows that do not form a consistent episode (the message names the episode and turn)."""


def build_sequences(episodes: Iterable[dict[str, Any]], turns: Iterable[dict[str, Any]],
                    sampling_by_harness: dict[str, tuple[float, int, float]]) -> list[TrainSequence]:
    """One :class:`TrainSequence` per episode whose status is ``ok``, in episode order.

    Raises:
        SequenceError: an episode with no turns, or turns that do not chain into one sequence
            (a gap in ``turn_idx``, a later turn that does not continue the previous one); an
            episode of a ``talkmesh`` harness (its turns are separate messages:
            :func:`tasks.talkmesh.episodes.talk_train_sequences`).
    """
    from tasks.rollout.turns import TurnsError, episode_sequence
    from tasks.talkmesh.episodes import is_mesh_turn

    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    out = []
    for ep in episodes:
        if ep["status"] != "ok":
            continue
        ts = sorted(by_ep.get(ep["episode_id"], []), key=lambda t: t["turn_idx"])
        if not ts:
            raise SequenceError(f"episode {ep['episode_id']} has no turns")
        if any(is_mesh_turn(t.get("action")) for t in ts):
            raise SequenceError(
                f"episode {ep['episode_id']} (harness {ep.get('harness_name', ep['harness_id'])}) is a TalkMesh run: its "
                "turns are separate messages with their own prompts, not one growing context, and cannot be chained "
                "into one sequence; train it with tasks.talkmesh.episodes.talk_train_sequences")
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
        out.append(TrainSequence(
            episode_id=ep["episode_id"], ids=ids, mask=mask, behaviour_logp=logp, reward=float(ep["reward"]),
            task_id=ep["task_id"], task_hash=ep["task_hash"], harness_id=ep["harness_id"],
            sampling_key=sampling_by_harness[ep["harness_id"]],
        ))
    return out
