"""A scripted episode runner: an instant policy and a trivial verifier, so that bookkeeping
(plan, seal, write, verify, statistics, exports) can be exercised and timed without a model.

It has :func:`tasks.rollout.stage.run_records`'s signature and return shape and is passed to
:func:`tasks.evaluate.stage.run_evaluate` as ``episode_runner`` by ``benchmarks/sealed_eval.py``
and the tests. It is never used by the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.hashing import canonical_json, seed_from, sha256_json


@dataclass
class ScriptedRunner:
    """Outcome of episode (record, tag, sample) from ``u = seed_from(seed, tag, record_id,
    sample) / 2**60`` (uniform in [0, 1)): ``infra_error`` when ``u < infra_rate``, else resolved
    (reward 1.0, answer ``"ok"``) with probability ``p_resolve[harness_name]``
    (``default_p`` otherwise), else unresolved (reward 0.0, answer ``"no"``).

    Each episode has one turn (token ids ``[1]`` -> ``[2]``) whose action is the final answer, or
    a call of the ``submit`` tool when the harness name is in ``tool_harnesses``, so the analyses
    of action distributions have something to read. ``calls`` records ``(tag, n_records, samples)``
    of every call.
    """

    p_resolve: dict[str, float] = field(default_factory=dict)
    default_p: float = 0.5
    infra_rate: float = 0.0
    seed: int = 0
    tool_harnesses: tuple[str, ...] = ()
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def __call__(self, policy: Any, cfg: Any, specs: dict, tasks: dict, records: list[dict[str, Any]], samples: int,
                 seed: int, tag: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.calls.append((tag, len(records), samples))
        eps, turns = [], []
        for r in records:
            p = self.p_resolve.get(r["harness_name"], self.default_p)
            for i in range(samples):
                s = seed_from(seed, r["record_id"], i)
                u = seed_from(self.seed, tag, r["record_id"], i) / float(1 << 60)  # seed_from has 60 bits
                infra = u < self.infra_rate
                ok = not infra and (u - self.infra_rate) / max(1.0 - self.infra_rate, 1e-12) < p
                eps.append({"episode_id": sha256_json([r["record_id"], tag, i, s]), "record": r, "sample_idx": i,
                            "seed": s, "policy_id": "scripted", "reward": 1.0 if ok else 0.0, "success": ok,
                            "status": "infra_error" if infra else "ok",
                            "stop_reason": "infra_error" if infra else "submitted", "num_turns": 1, "input_tokens": 1,
                            "output_tokens": 1, "final_answer": "ok" if ok else "no"})
                answer = "ok" if ok else "no"
                calls = ([{"tool": "submit", "impl": "submit", "args": {"answer": answer}}]
                         if r["harness_name"] in self.tool_harnesses else [])
                action = {"calls": calls, "answer": None if calls else answer, "error": None}
                turns.append({"episode_id": eps[-1]["episode_id"], "turn_idx": 0, "prompt_token_ids": [1],
                              "completion_token_ids": [2], "completion_logprobs": [-0.5], "loss_mask": [1],
                              "completion_text": answer, "finish_reason": "stop", "action": canonical_json(action),
                              "observation": "", "read_spans": ""})
        return eps, turns
