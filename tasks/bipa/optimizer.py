"""The skill optimizer of P2 (BiPA) and its evaluation: propose, select, replay, graph, report.

1. **Optimize**: the incumbent starts as the hand-written seed skill of the configured harness.
   Each round an LLM (the policy by default) is asked for a rewrite of the incumbent's skill; the
   candidate spec is ``seed_spec.model_copy(update={"skill": text})`` (a new ``harness_id``); it is
   scored on the selection tasks (``bipa.samples`` episodes per task) and accepted by
   ``bipa.accept`` against the incumbent's selection mean; an accepted candidate becomes the
   incumbent. Every candidate is a ``bipa_candidates`` row.
2. **Replay**: every scored candidate is re-scored on fresh episodes (new seeds, same selection
   tasks) and on held-out test tasks; the rule is re-applied per set (``bipa_replay``); the
   selection effect and the still-accepted count per set are ``bipa_effect``.
3. **Episode graph** of the seed and the learned (final incumbent) skill on the fresh and test
   episodes: ``bipa_graph_edges`` (+ GraphML) and ``bipa_graph_metrics``.
4. **Report**: ``bipa/report.md``.

Seeds: proposal i uses ``seed_from(cfg.seed, "bipa", "propose", i)``; the selection, fresh and
test episodes use ``seed_from(cfg.seed, "bipa", set)`` with the run_records tag ``bipa-<set>``
(episode seeds also depend on the record id, which depends on the candidate's harness_id).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.bipa import contracts as _contracts  # noqa: F401  (registers the contracts)
from tasks.bipa.config import BipaRunConfig
from tasks.bipa.graph import build_graph, edge_rows, graph_metrics, graphml_text
from tasks.bipa.replay import effect_rows, replay_table, set_mean
from tasks.harnesses.spec import HarnessSpec
from tasks.hashing import seed_from, sha256_text
from tasks.records.freeze import record_id

log = logging.getLogger("harnessrl.bipa")

PROPOSER_SYSTEM = ("You improve the written procedure that a small assistant follows to solve short math problems. "
                   "The assistant may run Python code blocks and must end with a line \"Answer: <number>\".")
PROPOSER_USER = ("Current procedure (mean reward {mean:.3f} on the practice problems):\n{skill}\n\n"
                 "Write an improved procedure as a short numbered list of steps. Reply with the procedure only.")


def clean_proposal(text: str, max_chars: int) -> str:
    """A proposer reply as skill text: surrounding whitespace and a wrapping code fence removed,
    cut to ``max_chars`` characters at the last line end that fits (or hard, if no line end).
    Returns "" when nothing is left."""
    lines = text.strip().splitlines()
    if lines and lines[0].lstrip().startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].strip().startswith("```"):
        lines = lines[:-1]
    out = "\n".join(lines).strip()
    if len(out) > max_chars:
        cut = out[:max_chars]
        out = (cut[: cut.rfind("\n")] if "\n" in cut else cut).strip()
    return out


def propose(proposer: Any, skill: str, mean: float, cfg: BipaRunConfig, seed: int) -> str:
    """One rewrite of ``skill`` by ``proposer`` (any policy engine: ``generate(prompts, sampling,
    seed)`` and ``tokenizer``), prompted through the tokenizer's chat template. Returns the raw
    completion text."""
    from tasks.rollout.generation import ChatFormat

    prompt = ChatFormat(proposer.tokenizer).initial(PROPOSER_SYSTEM, PROPOSER_USER.format(mean=mean, skill=skill))
    (g,) = proposer.generate([prompt], cfg.bipa.proposer_sampling, seed)
    return g.text


def spec_records(spec: HarnessSpec, tasks: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Records (``records`` contract rows) pairing ``tasks`` with ``spec``, as freeze makes them."""
    return [{"record_id": record_id(t["task_hash"], spec.harness_id, seed), "task_id": t["task_id"],
             "task_hash": t["task_hash"], "harness_id": spec.harness_id, "harness_name": spec.name,
             "split": t["split"], "seed": seed} for t in tasks]


@dataclass
class Scored:
    """One candidate scored on one set: per-task mean rewards, the episodes and their turns."""

    scores: dict[str, float]
    episodes: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)


def score_spec(policy: Any, cfg: BipaRunConfig, spec: HarnessSpec, tasks: list[dict[str, Any]], set_name: str
               ) -> Scored:
    """Run ``bipa.samples`` episodes per task of ``tasks`` under ``spec``; per-task score = mean
    reward over its episodes (an infrastructure error counts as reward 0 and is logged)."""
    from tasks.rollout.runner import run_records

    recs = spec_records(spec, tasks, cfg.seed)
    eps, turns = run_records(policy, cfg, {spec.harness_id: spec}, {t["task_id"]: t for t in tasks}, recs,
                             cfg.bipa.samples, seed_from(cfg.seed, "bipa", set_name), f"bipa-{set_name}")
    by_task: dict[str, list[float]] = {}
    for e in eps:
        by_task.setdefault(e["record"]["task_id"], []).append(float(e["reward"]))
    bad = sum(e["status"] == "infra_error" for e in eps)
    if bad:
        log.warning("bipa %s: %d of %d episodes ended with infra_error (scored 0)", set_name, bad, len(eps))
    return Scored({k: math.fsum(v) / len(v) for k, v in sorted(by_task.items())}, eps, turns)


def seed_harness_spec(store: Any, frozen: dict[str, Any], cfg: Any) -> Any:
    """The frozen :class:`~tasks.harnesses.spec.HarnessSpec` of the run's seed harness
    (``cfg.seed_harness_name()``).

    Raises:
        ValueError: it is not among the frozen harnesses."""
    from tasks.harnesses.frozen import harness_specs

    name = cfg.seed_harness_name()
    seed_spec = next((s for s in harness_specs(store, frozen["harnesses"]).values() if s.name == name), None)
    if seed_spec is None:
        raise ValueError(f"bipa: harness {name!r} is not among the frozen harnesses")
    return seed_spec


def _split_tasks(store: ArtifactStore, frozen: dict[str, ArtifactRef], cfg: BipaRunConfig
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tasks = store.rows(frozen["tasks"])
    train = [t for t in tasks if t["split"] == "train"]
    test = [t for t in tasks if t["split"] == "test"]
    b = cfg.bipa
    if len(train) < b.selection_tasks:
        raise ValueError(f"bipa.selection_tasks={b.selection_tasks} but the frozen train split has {len(train)} tasks")
    if len(test) < b.test_tasks:
        raise ValueError(f"bipa.test_tasks={b.test_tasks} but the frozen test split has {len(test)} tasks")
    return train[: b.selection_tasks], test[: b.test_tasks]


def run_bipa(store: ArtifactStore, cfg: BipaRunConfig, frozen: dict[str, ArtifactRef], policy: Any,
             proposer: Any = None) -> dict[str, ArtifactRef]:
    """Optimize, replay, build the episode graph and write the report (see the module docstring).

    Args:
        frozen: the freeze stage's refs (``tasks``, ``harnesses``).
        policy: a loaded policy engine (or :class:`tasks.rollout.fanout.PolicySource`) for episodes.
        proposer: the engine that writes rewrites; None: ``policy`` (which must then be loaded).

    Returns:
        refs of ``bipa_candidates``, ``bipa_replay``, ``bipa_effect``, ``bipa_graph_edges`` and
        ``bipa_graph_metrics`` (stage ``bipa``); ``bipa/episode_graph.graphml`` and
        ``bipa/report.md`` are written beside them.

    Raises:
        ValueError: too few train or test tasks for ``bipa.selection_tasks``/``test_tasks``; the
            seed harness is not among the frozen harnesses.
    """
    b = cfg.bipa
    proposer = proposer if proposer is not None else policy
    sel_tasks, test_tasks = _split_tasks(store, frozen, cfg)
    seed_spec = seed_harness_spec(store, frozen, cfg)

    # 1. optimize
    specs: dict[int, HarnessSpec] = {0: seed_spec}
    sel: dict[int, Scored] = {0: score_spec(policy, cfg, seed_spec, sel_tasks, "selection")}
    seed_mean = set_mean(sel[0].scores)
    cands = [{"candidate_idx": 0, "harness_id": seed_spec.harness_id, "skill": seed_spec.skill,
              "skill_sha256": sha256_text(seed_spec.skill or ""), "parent_idx": -1, "parent_sha256": None,
              "proposal_seed": None, "selection_scores": _j(sel[0].scores), "selection_mean": seed_mean,
              "incumbent_mean": None, "decision": "seed", "incumbent_after": 0}]
    inc = 0
    for i in range(1, b.candidates + 1):
        inc_mean = set_mean(sel[inc].scores)
        pseed = seed_from(cfg.seed, "bipa", "propose", i)
        text = clean_proposal(propose(proposer, specs[inc].skill or "", inc_mean, cfg, pseed), b.max_skill_chars)
        row = {"candidate_idx": i, "skill": text, "skill_sha256": sha256_text(text), "parent_idx": inc,
               "parent_sha256": sha256_text(specs[inc].skill or ""), "proposal_seed": pseed,
               "incumbent_mean": inc_mean}
        if not text:
            row.update(harness_id=None, selection_scores=None, selection_mean=None, decision="invalid",
                       incumbent_after=inc)
        else:
            spec = seed_spec.model_copy(update={"skill": text})
            specs[i] = spec
            sel[i] = score_spec(policy, cfg, spec, sel_tasks, "selection")
            m = set_mean(sel[i].scores)
            ok = b.accept.accepts(m, inc_mean)
            inc = i if ok else inc
            row.update(harness_id=spec.harness_id, selection_scores=_j(sel[i].scores), selection_mean=m,
                       decision="accepted" if ok else "rejected", incumbent_after=inc)
        log.info("bipa candidate %d: %s (selection %s vs incumbent %.3f)", i, row["decision"],
                 "n/a" if row["selection_mean"] is None else f"{row['selection_mean']:.3f}", inc_mean)
        cands.append(row)
    learned = inc

    # 2. replay
    fresh = {i: score_spec(policy, cfg, s, sel_tasks, "fresh") for i, s in specs.items()}
    test = {i: score_spec(policy, cfg, s, test_tasks, "test") for i, s in specs.items()}
    scores = {"selection": {i: s.scores for i, s in sel.items()}, "fresh": {i: s.scores for i, s in fresh.items()},
              "test": {i: s.scores for i, s in test.items()}}
    replay = replay_table(cands, scores, b.accept)
    effect = effect_rows(cands, scores, b.accept, bootstrap=b.bootstrap, seed=seed_from(cfg.seed, "bipa", "bootstrap"))

    # 3. episode graph
    arms = [("seed", 0)] + ([("learned", learned)] if learned != 0 else [])
    edges, metrics = [], []
    for set_name, runs in (("fresh", fresh), ("test", test)):
        for arm, idx in arms:
            turns = runs[idx].turns
            edges += edge_rows(turns, f"{arm}-{set_name}")
            metrics.append(graph_metrics(turns, arm, set_name))

    ch = cfg.config_hash()
    ins = [frozen["tasks"], frozen["harnesses"]]
    refs = {
        "bipa_candidates": store.write("bipa", "bipa_candidates", cands, inputs=ins, config_hash=ch),
        "bipa_replay": store.write("bipa", "bipa_replay", replay, inputs=ins, config_hash=ch),
        "bipa_effect": store.write("bipa", "bipa_effect", effect, inputs=ins, config_hash=ch),
        "bipa_graph_edges": store.write("bipa", "bipa_graph_edges", edges, inputs=ins, config_hash=ch),
        "bipa_graph_metrics": store.write("bipa", "bipa_graph_metrics", metrics, inputs=ins, config_hash=ch),
    }
    store.write_text("bipa/episode_graph.graphml", graphml_text(build_graph(edges)))
    from tasks.bipa.report import report_markdown

    store.write_text("bipa/report.md", report_markdown(cfg, cands, replay, effect, metrics, learned))
    return refs


def _j(d: dict[str, float]) -> str:
    from tasks.hashing import canonical_json

    return canonical_json(dict(sorted(d.items())))
