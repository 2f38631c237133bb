"""reasoning-gym suites (seeded procedural tasks with their own scorers): ``basic_arithmetic``,
``gsm_symbolic`` (GSM8K templates), ``countdown`` and any other dataset the package registers."""

from __future__ import annotations

import functools
from typing import Any, Iterator

from tasks.config import SuiteConfig
from tasks.hashing import canonical_json, jsonable
from tasks.records.suites.base import Task, register_loader

# metadata keys that carry the solution; they stay out of the task record entirely
_SOLUTION_KEYS = {"answer_cot", "answer_value", "variables", "solution"}


@functools.lru_cache(maxsize=32)
def _dataset(name: str, seed: int, size: int, params_json: str) -> Any:
    import json

    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(params_json))
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"reasoning-gym dataset {name!r} with params {params_json}: {e}") from None


def dataset_entry(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The (dataset, entry) a verifier spec points to, regenerated from its seed."""
    ds = _dataset(spec["dataset"], spec["seed"], spec["size"], canonical_json(spec["params"]))
    return ds, ds[spec["index"]]


@register_loader("reasoning_gym")
def load(cfg: SuiteConfig) -> Iterator[Task]:
    """Yield ``cfg.size`` tasks of reasoning-gym dataset ``cfg.name`` generated with ``cfg.seed``.

    The verifier spec keeps (dataset, seed, size, index, params, answer): grading regenerates the
    entry and calls the dataset's own ``score_answer``, or with ``reward: exact`` (kept in the spec)
    compares the answer with the reference exactly
    (:func:`tasks.records.verifiers.exact_answer_reward`).
    """
    ds = _dataset(cfg.name, cfg.seed, cfg.size, canonical_json(cfg.params))
    for i in range(cfg.size):
        entry = ds[i]
        meta = {k: v for k, v in entry.get("metadata", {}).items() if k not in _SOLUTION_KEYS}
        yield Task(
            task_id=f"{cfg.name}/s{cfg.seed}/{i}",
            suite=f"reasoning_gym/{cfg.name}",
            instruction=entry["question"],
            verifier_kind="reasoning_gym",
            verifier_spec={
                "dataset": cfg.name, "seed": cfg.seed, "size": cfg.size, "index": i,
                "params": dict(cfg.params), "answer": str(entry["answer"]),
                # only when set, so that the default's task hashes stay what they were
                **({"reward": "exact"} if cfg.reward == "exact" else {}),
            },
            metadata=jsonable(meta),
        )

