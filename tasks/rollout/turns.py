"""Turn rows store what each turn adds; every prompt is rebuilt from its episode's turns.

The ``turns`` contract (v2) keeps storage linear in the context length. A turn row holds
``prompt_continues`` and ``prompt_added_ids``:

- ``prompt_continues`` True: the turn's prompt is the previous turn's prompt, then the previous
  turn's completion, then ``prompt_added_ids`` (the chat-format tokens that close the reply, the
  observation, the next assistant header):
  ``prompt_t = prompt_{t-1} + completion_{t-1} + prompt_added_ids_t``;
- ``prompt_continues`` False: ``prompt_added_ids`` is the whole prompt: the first turn of every
  episode, and every turn of a TalkMesh episode (each agent message has its own prompt).

An engine episode of T turns with a final context of L tokens stores L tokens (v1 stored every
prompt again: up to T x L). :func:`episode_prompts` is the one function that turns rows back into
prompts; :func:`episode_sequence` chains an episode into one token sequence (what the trainer
scores) without building the prompts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any


class TurnsError(ValueError):
    """Turn rows that do not form an episode: a gap or a repeat in ``turn_idx``, a first turn that
    claims to continue a previous one, or a turn that does not continue where a chained sequence
    is needed. The message names the episode and the turn."""


def first_turn(prompt: Sequence[int]) -> dict[str, Any]:
    """The prompt columns of a turn that stores its whole prompt (an episode's first turn, a
    TalkMesh message): ``{"prompt_continues": False, "prompt_added_ids": list(prompt)}``."""
    return {"prompt_continues": False, "prompt_added_ids": list(prompt)}


def next_turn(added: Sequence[int]) -> dict[str, Any]:
    """The prompt columns of a turn whose prompt extends the previous turn's prompt + completion
    by ``added``: ``{"prompt_continues": True, "prompt_added_ids": list(added)}``."""
    return {"prompt_continues": True, "prompt_added_ids": list(added)}


def by_episode(turns: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Turn rows grouped by ``episode_id`` (first-seen order), each group sorted by ``turn_idx``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        out.setdefault(t["episode_id"], []).append(t)
    for ts in out.values():
        ts.sort(key=lambda t: int(t["turn_idx"]))
    return out


def _checked(turns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    ts = sorted(turns, key=lambda t: int(t["turn_idx"]))
    eid = ts[0]["episode_id"] if ts else "?"
    for i, t in enumerate(ts):
        if int(t["turn_idx"]) != i:
            raise TurnsError(f"episode {eid}: turn_idx {[int(x['turn_idx']) for x in ts][:12]} is not 0..{len(ts) - 1}")
        if t["episode_id"] != eid:
            raise TurnsError(f"turns of episodes {eid} and {t['episode_id']} given as one episode")
    if ts and ts[0]["prompt_continues"]:
        raise TurnsError(f"episode {eid} turn 0: prompt_continues is true, but there is no earlier turn")
    return ts


def iter_prompts(turns: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[int]]]:
    """``(turn row, its full prompt)`` for each turn of one episode, in ``turn_idx`` order.

    Each prompt is a new list (the caller may keep or change it); only the current one is held,
    so walking an episode needs memory linear in its context.

    Raises:
        TurnsError: ``turns`` are not turns 0..T-1 of one episode, or turn 0 continues.
    """
    cur: list[int] = []
    prev_completion: Sequence[int] = ()
    for t in _checked(turns):
        if t["prompt_continues"]:
            cur.extend(int(x) for x in prev_completion)
        else:
            cur = []
        cur.extend(int(x) for x in t["prompt_added_ids"])
        prev_completion = t["completion_token_ids"]
        yield t, list(cur)


def episode_prompts(turns: Sequence[dict[str, Any]]) -> list[list[int]]:
    """The full prompt (token ids) of every turn of one episode, in ``turn_idx`` order:
    ``prompt_t = prompt_{t-1} + completion_{t-1} + prompt_added_ids_t`` when the turn continues,
    else ``prompt_added_ids_t`` (module docstring).

    Memory is the sum of the prompts (quadratic in the turns of a growing context): for a chained
    sequence use :func:`episode_sequence`, for one turn at a time :func:`iter_prompts`.

    Raises:
        TurnsError: see :func:`iter_prompts`.
    """
    return [p for _, p in iter_prompts(turns)]


def prompt_lengths(turns: Sequence[dict[str, Any]]) -> list[int]:
    """Each turn's full prompt length in tokens, in ``turn_idx`` order, without building the
    prompts. Raises TurnsError (see :func:`iter_prompts`)."""
    out: list[int] = []
    prev, prev_completion = 0, 0
    for t in _checked(turns):
        n = len(t["prompt_added_ids"])
        prev = prev + prev_completion + n if t["prompt_continues"] else n
        prev_completion = len(t["completion_token_ids"])
        out.append(prev)
    return out


def episode_sequence(turns: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """One episode as one token sequence: turn 0's prompt, its completion, turn 1's added prompt
    tokens, its completion, ... ; and where each turn's completion starts.

    Returns:
        ``(ids, starts)``: ``ids`` = the last turn's full prompt + its completion (length L);
        ``starts[t]`` = turn t's full prompt length, so its completion is
        ``ids[starts[t]:starts[t] + len(completion_t)]``.

    Raises:
        TurnsError: a turn after the first does not continue its predecessor (a TalkMesh
            episode: its messages are separate prompts, not one context), or see
            :func:`iter_prompts`.
    """
    ids: list[int] = []
    starts: list[int] = []
    for t in _checked(turns):
        if int(t["turn_idx"]) > 0 and not t["prompt_continues"]:
            raise TurnsError(f"episode {t['episode_id']} turn {t['turn_idx']}: its prompt does not continue turn "
                             f"{int(t['turn_idx']) - 1}'s prompt + completion, so the episode is not one sequence")
        ids += [int(x) for x in t["prompt_added_ids"]]
        starts.append(len(ids))
        ids += [int(x) for x in t["completion_token_ids"]]
    return ids, starts
