"""A scripted episode runner: an instant policy and a trivial verifier, so that bookkeeping
(plan, seal, write, verify, statistics, exports) can be exercised and timed without a model.

It has :func:`tasks.rollout.runner.iter_records`'s signature and yields chunks as it does; it is
passed to :func:`tasks.evaluate.stage.run_evaluate` as ``episode_runner`` by
``benchmarks/sealed_eval.py`` and the tests. It is never used by the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tasks.hashing import canonical_json, seed_from, sha256_json
from tasks.rollout.turns import first_turn, next_turn


@dataclass
class ScriptedRunner:
    """Outcome of episode (record, tag, sample) from ``u = seed_from(seed, tag, record_id,
    sample) / 2**60`` (uniform in [0, 1)): ``infra_error`` when ``u < infra_rate``, else resolved
    (reward 1.0, answer ``"ok"``) with probability ``p_resolve[harness_name]``
    (``default_p`` otherwise; ``p_checkpoint[checkpoint]`` for the attempts of a checkpoint it
    names, the call's tag being ``eval:<checkpoint>...``), else unresolved (reward 0.0, answer
    ``"no"``).

    With ``turns`` = 1 (the default) each episode has one turn (token ids ``[1]`` -> ``[2]``) whose
    action is the final answer, or a call of the ``submit`` tool when the harness name is in
    ``tool_harnesses``, so the analyses of action distributions have something to read. With
    ``turns`` = T > 1 each episode is an agentic one of T turns whose context reaches
    ``context_tokens`` tokens: a first prompt of a quarter of them, then T completions and T - 1
    observations of equal share (turns 0..T-2 call a ``bash`` tool, the last one answers), stored as
    the rollout engine stores turns (each turn's added prompt tokens, :mod:`tasks.rollout.turns`);
    token ids are drawn with ``numpy.random.default_rng(episode seed)`` (distinct per episode, so
    the Parquet file is as hard to compress as real tokens).

    Chunks of ``chunk_records`` records (x ``samples``) are yielded; ``calls`` records ``(tag,
    n_records, samples)`` of every call and ``seconds`` the time spent producing rows (not the
    caller's time between chunks).
    """

    p_resolve: dict[str, float] = field(default_factory=dict)
    default_p: float = 0.5
    # the resolve probability of a checkpoint's attempts (a call tagged ``eval:<checkpoint>...``),
    # before p_resolve and default_p: tests give training arms and seeds different pass rates
    p_checkpoint: dict[str, float] = field(default_factory=dict)
    infra_rate: float = 0.0
    seed: int = 0
    tool_harnesses: tuple[str, ...] = ()
    turns: int = 1
    context_tokens: int = 2000
    chunk_records: int = 64
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.turns < 1 or self.chunk_records < 1:
            raise ValueError(f"ScriptedRunner: turns={self.turns} and chunk_records={self.chunk_records} must be >= 1")
        first = self.context_tokens // 4
        per = (self.context_tokens - first) // (2 * self.turns - 1) if self.turns > 1 else 0
        if self.turns > 1 and per < 1:
            raise ValueError(f"ScriptedRunner: context_tokens={self.context_tokens} too small for {self.turns} turns")
        self._first, self._per = first, per

    def __call__(self, policy: Any, cfg: Any, specs: dict, tasks: dict, records: list[dict[str, Any]], samples: int,
                 seed: int, tag: str) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        self.calls.append((tag, len(records), samples))
        for i in range(0, len(records), self.chunk_records):
            t0 = time.perf_counter()
            chunk = self._chunk(records[i:i + self.chunk_records], samples, seed, tag)
            self.seconds += time.perf_counter() - t0
            yield chunk

    def _chunk(self, records: list[dict[str, Any]], samples: int, seed: int, tag: str
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        eps: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        for r in records:
            ck = tag.split(":")[1] if tag.startswith("eval:") else None
            p = self.p_checkpoint[ck] if ck in self.p_checkpoint else self.p_resolve.get(r["harness_name"],
                                                                                          self.default_p)
            for i in range(samples):
                s = seed_from(seed, r["record_id"], i)
                u = seed_from(self.seed, tag, r["record_id"], i) / float(1 << 60)  # seed_from has 60 bits
                infra = u < self.infra_rate
                ok = not infra and (u - self.infra_rate) / max(1.0 - self.infra_rate, 1e-12) < p
                answer = "ok" if ok else "no"
                eid = sha256_json([r["record_id"], tag, i, s])
                if self.turns == 1:
                    calls = ([{"tool": "submit", "impl": "submit", "args": {"answer": answer}}]
                             if r["harness_name"] in self.tool_harnesses else [])
                    action = {"calls": calls, "answer": None if calls else answer, "error": None}
                    ep_turns = [{"episode_id": eid, "turn_idx": 0, **first_turn([1]), "completion_token_ids": [2],
                                 "completion_logprobs": [-0.5], "loss_mask": [1], "completion_text": answer,
                                 "finish_reason": "stop", "action": canonical_json(action), "observation": "",
                                 "read_spans": ""}]
                    in_tok = 1
                else:
                    ep_turns, in_tok = self._agentic(eid, s, answer)
                turns += ep_turns
                eps.append({"episode_id": eid, "record": r, "sample_idx": i, "seed": s, "policy_id": "scripted",
                            "reward": 1.0 if ok else 0.0, "success": ok, "status": "infra_error" if infra else "ok",
                            "stop_reason": "infra_error" if infra else "submitted",
                            "num_turns": len(ep_turns), "input_tokens": in_tok,
                            "output_tokens": sum(len(t["completion_token_ids"]) for t in ep_turns),
                            "final_answer": answer, "answer_parsed": not infra})
        return eps, turns

    def _agentic(self, eid: str, s: int, answer: str) -> tuple[list[dict[str, Any]], int]:
        """One episode of ``turns`` turns (class docstring); returns its rows and its input
        tokens (the sum of its full prompt lengths)."""
        import numpy as np

        per = self._per
        ids = np.random.default_rng(s).integers(5, 50_000, size=self._first + (2 * self.turns - 1) * per,
                                                 dtype=np.int32).tolist()
        rows, pos, prompt_len, in_tok = [], 0, 0, 0
        for t in range(self.turns):
            n = self._first if t == 0 else per
            added, comp = ids[pos:pos + n], ids[pos + n:pos + n + per]
            pos += n + per
            last = t == self.turns - 1
            action = ({"calls": [], "answer": answer, "error": None} if last else
                      {"calls": [{"tool": "bash", "impl": "bash", "args": {"command": f"step {t}"}}], "answer": None,
                       "error": None})
            prompt_len += n + (per if t else 0)
            in_tok += prompt_len
            rows.append({"episode_id": eid, "turn_idx": t, **(next_turn(added) if t else first_turn(added)),
                         "completion_token_ids": comp, "completion_logprobs": [-0.5] * per, "loss_mask": [1] * per,
                         "completion_text": answer if last else f"step {t}", "finish_reason": "stop",
                         "action": canonical_json(action), "observation": "" if last else f"output of step {t}",
                         "read_spans": ""})
        return rows, in_tok
