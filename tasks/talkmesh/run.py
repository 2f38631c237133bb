"""A TalkMesh run (P3) over frozen tasks: proposals, the confidence head, the talk policy's GRPO,
the mesh against majority and confidence-weighted vote, the collusion experiment, and the report.

1. **Proposals**: ``train_samples`` per training problem and ``samples`` (K) per test problem
   from the base policy (one engine call per split, seeded by ``seed_from(seed, "talkmesh", split)``); graded by
   the task's verifier (correct iff reward 1.0).
2. **Confidence head** (:mod:`tasks.talkmesh.calibration`): fitted on the training proposals
   with a parsable answer; reliability bins, ECE and Brier score on train and test.
3. **Talk GRPO** (``train_talk``): ``talk_group`` meshes per training problem with the base talk
   policy (different talk seeds); their hints and revisions are the batch
   (:func:`tasks.talkmesh.talk.talk_sequences`), trained into a LoRA adapter by
   :func:`tasks.train.loops.train` under the run's ``train`` section.
4. **Evaluation** on the test problems: vote curves for k = 1..K; the mesh (agents = the first N
   samples) with the base talk policy and with the trained one; for each m in ``colluders``: the
   undefended and the defended mesh and majority vote over the N agents' answers, m of them
   poisoned. Colluders are a seeded draw of m agents; their poisoned answer is the smallest
   integer offset (+1, -1, +2, ...) of the reference answer that the verifier grades wrong (a
   worst-case adversary knows the answer; the agents never see it). The mesh's own N agents
   voting without talk (majority and confidence-weighted) are its paired baselines: each mesh
   condition is contrasted with them problem by problem
   (:func:`tasks.talkmesh.baselines.paired_contrasts`).
5. Tables under ``talkmesh/`` (Parquet, contracts in :mod:`tasks.talkmesh.contracts`), the talk
   adapter, ``report.md`` and ``accuracy_vs_outputs.png``.

Sealed (:mod:`tasks.talkmesh.seal`): the plan of step 4 is committed and signed before the first
sample (step 1), the test proposals and every test mesh's results are hash-chained to it and the
chain head signed, so ``harnessrl verify`` recomputes the findings from the sealed rows.

Resumable (:mod:`tasks.talkmesh.resume`): the proposals, every mesh run and the talk training are
kept as they finish, so the same config run again into the same folder after a kill reuses them.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from schemas import ArtifactRef, ArtifactStore
from tasks.hashing import seed_from, sha256_dir
from tasks.talkmesh import contracts as _contracts  # noqa: F401  (registers the contracts)
from tasks.talkmesh.config import TalkMeshRunConfig
from tasks.talkmesh.mesh import MeshResult, MeshSettings, Output, Problem, run_mesh, weighted_vote

log = logging.getLogger("harnessrl.talkmesh")


def pick_problems(tasks: list[dict[str, Any]], split: str, n: int, distinct: bool = False) -> list[Problem]:
    """The first ``n`` tasks of ``split`` by task hash, as problems. ``distinct``: skip a task whose
    normalised problem (:func:`tasks.records.overlap.problem_key`) an earlier task of the split
    already has, so no two problems are draws of one expression.

    Raises:
        ValueError: the split has fewer than ``n`` (distinct) tasks.
    """
    from tasks.records.overlap import problem_key

    rows = sorted((t for t in tasks if t["split"] == split), key=lambda t: t["task_hash"])
    if distinct:
        seen: set[str] = set()
        kept = []
        for t in rows:
            if problem_key(t) not in seen:
                seen.add(problem_key(t))
                kept.append(t)
        rows = kept
    if len(rows) < n:
        what = "distinct problems" if distinct else "tasks"
        raise ValueError(f"talkmesh: {n} {split} problems wanted but the frozen {split} split has {len(rows)} {what}")
    return [Problem(t["task_id"], t["instruction"], t["verifier_kind"], t["verifier_spec"]) for t in rows[:n]]


class Grader:
    """Correctness by the task's verifier (reward 1.0), cached per (problem, answer)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], bool] = {}

    def __call__(self, p: Problem, answer: str | None) -> bool:
        from tasks.records.verifiers import score

        if answer is None:
            return False
        key = (p.problem_id, answer)
        if key not in self._cache:
            self._cache[key] = score(p.verifier_kind, p.verifier_spec, answer) >= 1.0
        return self._cache[key]


def poison_answer(p: Problem, correct: Callable[[Problem, str | None], bool]) -> str:
    """The colluders' wrong answer: reference + d for d = 1, -1, 2, -2, ... (integers; a decimal
    reference keeps its form), the first the grader marks wrong.

    Raises:
        ValueError: the reference is not a number, or no offset up to 100 is graded wrong.
    """
    ref = json.loads(p.verifier_spec)["answer"] if p.verifier_spec else ""
    try:
        x = float(ref)
    except ValueError:
        raise ValueError(f"talkmesh: problem {p.problem_id}: reference answer {ref!r} is not a number; the poisoned "
                         "answer is defined for numeric answers only") from None
    for d in [s * m for m in range(1, 101) for s in (1, -1)]:
        cand = str(int(x) + d) if x == int(x) else str(x + d)
        if not correct(p, cand):
            return cand
    raise ValueError(f"talkmesh: problem {p.problem_id}: no wrong integer offset of {ref!r} found")


def calibration_rows(split: str, conf: list[float], ok: list[bool], bins: int) -> list[dict[str, Any]]:
    """Reliability bins of one split (``talkmesh_calibration`` rows)."""
    from tasks.talkmesh.calibration import expected_calibration_error

    ece = expected_calibration_error(conf, ok, bins)
    brier = sum((c - float(y)) ** 2 for c, y in zip(conf, ok)) / len(conf)
    rows = []
    for b in range(bins):
        idx = [i for i, c in enumerate(conf) if min(int(c * bins), bins - 1) == b]
        rows.append({"split": split, "bin": b, "lo": b / bins, "hi": (b + 1) / bins, "n": len(idx),
                     "mean_confidence": sum(conf[i] for i in idx) / len(idx) if idx else None,
                     "accuracy": sum(ok[i] for i in idx) / len(idx) if idx else None, "ece": ece, "brier": brier})
    return rows


def summary_row(condition: str, res: MeshResult, *, agents: int, colluders: int, defended: bool,
                talk: str) -> dict[str, Any]:
    """One ``talkmesh_summary`` row from a mesh run."""
    n = len(res.results)
    return {"condition": condition, "agents": agents, "colluders": colluders, "defended": defended, "talk": talk,
            "problems": n, "accuracy": sum(r["correct"] for r in res.results) / n,
            "outputs_spent": sum(r["outputs_spent"] for r in res.results) / n,
            "consensus_rate": sum(r["consensus"] for r in res.results) / n,
            "revisions": sum(m["revision"] is not None for m in res.messages),
            "kept": sum(bool(m["kept"]) for m in res.messages),
            "hints_ignored": sum(bool(m["hint_ignored"]) for m in res.messages)}


def run_talkmesh(store: ArtifactStore, cfg: TalkMeshRunConfig, frozen: dict[str, ArtifactRef],
                 load: Callable[[Path | None], Any]) -> dict[str, ArtifactRef]:
    """Run steps 1-5 of the module docstring and write the artifacts under ``talkmesh/``.

    Args:
        frozen: the freeze stage's refs (``tasks``, ``harnesses``).
        load: adapter folder (None: the base model) -> a policy engine (closed by this function
            when it has ``close``).

    Returns the written refs by name. Raises ValueError on too few frozen problems, a harness
    missing from the frozen ones, or a non-numeric reference answer under collusion.
    """
    from tasks.rollout.engines import close_policy
    from tasks.rollout.models import load_model_and_tokenizer, model_id, resolve_model
    from tasks.harnesses.frozen import harness_specs
    from tasks.talkmesh.baselines import vote_curves
    from tasks.talkmesh.calibration import HiddenStates, fit_head
    from tasks.talkmesh.talk import LMTalk, talk_sequences

    tm = cfg.talkmesh
    t_start = time.perf_counter()
    from tasks.hashing import sha256_text
    from tasks.talkmesh.resume import StepCache

    cache = StepCache(store, sha256_text("|".join([cfg.section_hash("policy", "train", "talkmesh", "suites", "split"),
                                                   frozen["tasks"].sha256, frozen["harnesses"].sha256])))
    tasks = store.rows(frozen["tasks"])
    train_p = pick_problems(tasks, "train", tm.train_problems, bool(tm.distinct_problems))
    test_p = pick_problems(tasks, "test", tm.test_problems, bool(tm.distinct_problems))
    spec = next((s for s in harness_specs(store, frozen["harnesses"]).values() if s.name == tm.harness), None)
    if spec is None:
        raise ValueError(f"talkmesh: harness {tm.harness!r} is not among the frozen harnesses")
    grader = Grader()
    settings = MeshSettings(agents=tm.agents, topology=tm.topology, degree=tm.degree, rounds=tm.rounds,
                            threshold=tm.threshold, gossip_steps=tm.gossip_steps, seed=seed_from(cfg.seed, "topology") % 2**31)
    timing: dict[str, float] = {}

    # the plan of the measurement, committed and signed before the first test sample (seal.py)
    from tasks.evaluate.prereg import read_preregistration
    from tasks.talkmesh.seal import build_plan, commit_plan, planned_conditions

    train_talk = bool(tm.train_talk)
    word = "talk" if train_talk else "base"
    size_cond = {tm.agents: "mesh-talk" if train_talk else "mesh-base",
                 **{n: f"mesh-{word}-n{n}" for n in tm.mesh_sizes or []}}
    pre = read_preregistration(store)
    plan = build_plan(config_hash=cfg.section_hash("policy", "train", "talkmesh", "suites", "split"),
                      tasks_sha256=frozen["tasks"].sha256, harnesses_sha256=frozen["harnesses"].sha256,
                      model=cfg.policy.model, harness=tm.harness, test_problems=[p.problem_id for p in test_p],
                      samples=tm.samples, proposal_seed=seed_from(cfg.seed, "talkmesh", "test") % 2**31,
                      conditions=planned_conditions(tm, train_talk), size_conditions=size_cond,
                      vote_seed=seed_from(cfg.seed, "resamples") % 2**31, resamples=tm.resamples,
                      findings=tm.findings, findings_seed=seed_from(cfg.seed, "talkmesh", "findings") % 2**31,
                      preregistration=pre[1] if pre else None)
    p_hash, signing_key = commit_plan(store, plan)
    log.info("talkmesh: plan %s committed and signed before the first test sample", p_hash[:16])
    sealed_meshes: list[tuple[str, int, list[dict[str, Any]]]] = []  # (condition, repeat, results) as run
    trained_from: int | None = None

    # 2. the head's model (hidden states on the CPU in float32)
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    hmodel, htok = load_model_and_tokenizer(model_dir, "cpu", "float32")
    hs = HiddenStates(hmodel, htok, spec.system_prompt, batch_size=tm.head.batch_size)

    base = load(None)
    try:
        talk = LMTalk(base, spec, tm.proposal_sampling, tm.talk_sampling, tm.max_solution_chars)
        t0 = time.perf_counter()
        train_props, test_props = cache.step("proposals", lambda: (
            talk.propose(train_p, tm.train_samples, seed_from(cfg.seed, "talkmesh", "train") % 2**31),
            talk.propose(test_p, tm.samples, plan["proposal_seed"])))
        timing["proposals_s"] = time.perf_counter() - t0
        log.info("talkmesh: %d + %d proposals in %.1f s", len(train_p) * tm.train_samples, len(test_p) * tm.samples,
                 timing["proposals_s"])

        t0 = time.perf_counter()
        items = [(p, o.answer) for p, row in zip(train_p, train_props) for o in row if o.answer is not None]
        if not items:
            raise ValueError("talkmesh: no training proposal has a parsable answer; the head cannot be fitted")
        labels = [grader(p, a) for p, a in items]
        head = fit_head(hs([(p.question, a) for p, a in items]), labels, l2=tm.head.l2, steps=tm.head.steps,
                        seed=seed_from(cfg.seed, "head") % 2**31)

        def score(its: Any) -> list[float]:
            its = list(its)
            return head.predict(hs([(p.question, a) for p, a in its])) if its else []

        conf_train = score(items)
        test_items = [(p, o.answer) for p, row in zip(test_p, test_props) for o in row if o.answer is not None]
        conf_test = score(test_items)
        calib = calibration_rows("train", conf_train, labels, tm.head.bins)
        if test_items:
            calib += calibration_rows("test", conf_test, [grader(p, a) for p, a in test_items], tm.head.bins)
        timing["head_s"] = time.perf_counter() - t0

        # 4a. vote curves
        cmap = dict(zip([(p.problem_id, a) for p, a in test_items], conf_test))
        answers = [[o.answer for o in row] for row in test_props]
        confs = [[cmap.get((p.problem_id, o.answer), 0.0) for o in row] for p, row in zip(test_p, test_props)]
        oks = [{a: grader(p, a) for a in set(row)} for p, row in zip(test_p, answers)]
        curves = vote_curves(answers, confs, oks, k_max=tm.samples, resamples=tm.resamples, seed=plan["vote_seed"])

        agents_train = [row[:tm.agents] for row in train_props]
        agents_test = [row[:tm.agents] for row in test_props]
        messages: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        summary: list[dict[str, Any]] = []
        per_problem: dict[str, list[bool]] = {}  # condition -> correct per test problem, in test_p order

        def vote_row(cond: str, votes: list[list[tuple[str | None, float]]], colluders: int) -> None:
            hits = [bool(grader(p, weighted_vote(v))) for p, v in zip(test_p, votes)]
            per_problem[cond] = hits
            summary.append({"condition": cond, "agents": tm.agents, "colluders": colluders, "defended": False,
                            "talk": "none", "problems": len(test_p), "accuracy": sum(hits) / len(test_p),
                            "outputs_spent": float(tm.agents), "consensus_rate": None, "revisions": 0, "kept": 0,
                            "hints_ignored": 0})

        # the mesh's own agents, voting without talking (the paired baselines of the mesh)
        vote_row("majority-agents", [[(o.answer, 1.0) for o in row] for row in agents_test], 0)
        vote_row("confidence-weighted-agents", [[(o.answer, cmap.get((p.problem_id, o.answer), 0.0)) for o in row]
                                                for p, row in zip(test_p, agents_test)], 0)

        def record(cond: str, res: MeshResult, **kw: Any) -> None:
            sealed_meshes.append((cond, 0, res.results))
            messages.extend({"condition": cond, **m} for m in res.messages)
            results.extend({"condition": cond, **r} for r in res.results)
            summary.append(summary_row(cond, res, agents=tm.agents, **kw))
            got = {r["problem_id"]: bool(r["correct"]) for r in res.results}
            per_problem[cond] = [got[p.problem_id] for p in test_p]
            log.info("talkmesh: %s: accuracy %.3f, %.1f outputs/problem", cond, summary[-1]["accuracy"],
                     summary[-1]["outputs_spent"])

        def mesh(tk: Any, props: Any, probs: list[Problem], cond: str, **kw: Any) -> MeshResult:
            return run_mesh(probs, props, score, tk, grader, settings, seed=seed_from(cfg.seed, "talkmesh", cond) % 2**31,
                            **kw)

        reps = tm.mesh_repeats or 1
        mesh_points: dict[str, dict[str, Any]] = {}  # condition -> agents, per-problem accuracy, outputs spent

        def evaluate_mesh(tk: Any, cond: str, n: int, label: str) -> None:
            """The n-agent mesh on the test problems, ``reps`` times (repeat r on samples [r*n, (r+1)*n),
            its rows under ``cond`` for r = 0 and ``cond-r<r>`` after); the summary row and the
            per-problem accuracy are over every repeat."""
            st = replace(settings, agents=n)
            merged = MeshResult()
            acc = [0.0] * len(test_p)
            for r in range(reps):
                c = cond if r == 0 else f"{cond}-r{r}"
                res = cache.step(c, lambda: run_mesh(test_p, [row[r * n:(r + 1) * n] for row in test_props], score, tk,
                                                     grader, st, seed=seed_from(cfg.seed, "talkmesh", c) % 2**31))
                messages.extend({"condition": c, **m} for m in res.messages)
                results.extend({"condition": c, **x} for x in res.results)
                sealed_meshes.append((cond, r, res.results))
                merged.messages += res.messages
                merged.results += res.results
                got = {x["problem_id"]: bool(x["correct"]) for x in res.results}
                acc = [a + got[p.problem_id] / reps for a, p in zip(acc, test_p)]
            summary.append(summary_row(cond, merged, agents=n, colluders=0, defended=False, talk=label))
            per_problem[cond] = [bool(a) for a in acc] if reps == 1 else acc
            mesh_points[cond] = {"agents": n, "per_problem": acc, "outputs_spent": summary[-1]["outputs_spent"]}
            log.info("talkmesh: %s (%d agents, %d repeat(s)): accuracy %.3f, %.1f outputs/problem", cond, n, reps,
                     summary[-1]["accuracy"], summary[-1]["outputs_spent"])

        t0 = time.perf_counter()
        evaluate_mesh(talk, "mesh-base", tm.agents, "base")
        revisions: list[dict[str, Any]] = []
        if tm.train_talk:
            for g in range(tm.talk_group):
                revisions += cache.step(f"train-{g}", lambda: mesh(talk, agents_train, train_p, f"train-{g}").revisions)
        timing["mesh_base_s"] = time.perf_counter() - t0
    finally:
        close_policy(base)

    refs: dict[str, ArtifactRef] = {}
    adapter = None
    adapter_sha: str | None = None
    talk_rows: list[dict[str, Any]] = []
    train_steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="talkmesh-adapter-") as tmp:
        if tm.train_talk:
            from tasks.train.loops import train
            from tasks.train.trainer import normalize_adapter_config

            seqs, talk_rows = talk_sequences(revisions, tm.talk_sampling)
            if not seqs:
                raise ValueError("talkmesh: the training meshes made no model-written hint or revision (every agent "
                                 "was above talkmesh.threshold?); nothing to train the talk policy on")
            t0 = time.perf_counter()

            def train_talk() -> list[dict[str, Any]]:
                result = train(cfg, model_dir, seqs, Path(tmp) / "adapter", log=log.info)
                normalize_adapter_config(result.adapter_dir, base_model_id=model_id(model_dir))
                store.put_dir("talkmesh/talk_adapter", result.adapter_dir)
                return result.steps

            train_steps = cache.step("talk-train", train_talk)
            adapter = Path(tmp) / "adapter"
            if not adapter.is_dir():  # a resumed run: the adapter the earlier attempt trained and stored
                store.fs.get(store._abs("talkmesh/talk_adapter"), str(adapter), recursive=True)
            timing["talk_train_s"] = time.perf_counter() - t0
        trained = load(adapter) if adapter is not None else load(None)
        try:
            t0 = time.perf_counter()
            ttalk = LMTalk(trained, spec, tm.proposal_sampling, tm.talk_sampling, tm.max_solution_chars)
            label = "trained" if adapter is not None else "base"
            if adapter is not None:
                trained_from = len(sealed_meshes)
                adapter_sha = sha256_dir(adapter)
                evaluate_mesh(ttalk, "mesh-talk", tm.agents, label)
            for n in tm.mesh_sizes or []:
                evaluate_mesh(ttalk, size_cond[n], n, label)
            for m in tm.colluders:
                coll = frozenset(random.Random(seed_from(cfg.seed, "colluders", m)).sample(range(tm.agents), m))
                poison = {p.problem_id: poison_answer(p, grader) for p in test_p}
                for defended in (False, True):
                    cond = f"collusion-m{m}-{'defended' if defended else 'undefended'}"
                    record(cond, cache.step(cond, lambda: mesh(ttalk, agents_test, test_p, cond, colluders=coll,
                                                               poison=lambda p: poison[p.problem_id],
                                                               defended=defended)),
                           colluders=m, defended=defended, talk=label)
                vote_row(f"collusion-m{m}-majority",
                         [[(poison[p.problem_id] if i in coll else o.answer, 1.0) for i, o in enumerate(row)]
                          for p, row in zip(test_p, agents_test)], m)
            timing["mesh_eval_s"] = time.perf_counter() - t0
        finally:
            close_policy(trained)
    timing["reused_s"] = cache.reused_s  # seconds of the steps an earlier, killed attempt made (resume.py)
    timing["total_s"] = time.perf_counter() - t_start + cache.reused_s
    from tasks.talkmesh.baselines import contrast_pairs, paired_contrasts
    from tasks.talkmesh.report import plot_budget_png, plot_png, report_markdown

    contrasts = paired_contrasts(per_problem, contrast_pairs(tm.colluders), resamples=tm.bootstrap_resamples,
                                 seed=seed_from(cfg.seed, "talkmesh", "bootstrap") % 2**31)
    budget: list[dict[str, Any]] = []
    equal: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    if tm.mesh_sizes is not None or tm.findings is not None:
        from tasks.talkmesh.baselines import vote_matrix
        from tasks.talkmesh.findings import budget_rows, equal_budget_rows, finding_table

        votes = vote_matrix(answers, confs, oks, k_max=tm.samples, resamples=tm.resamples,
                            seed=plan["vote_seed"])  # the curves' orderings
        budget = budget_rows(votes, mesh_points, resamples=tm.bootstrap_resamples,
                             seed=seed_from(cfg.seed, "talkmesh", "budget") % 2**31)
        equal = equal_budget_rows(mesh_points, votes["majority"], resamples=tm.bootstrap_resamples,
                                  seed=seed_from(cfg.seed, "talkmesh", "equal-budget") % 2**31)
        if tm.findings is not None:
            found = finding_table(tm.findings.rules, {n: (c, mesh_points[c]["per_problem"]) for n, c in size_cond.items()},
                                  votes["majority"], alpha=tm.findings.alpha,
                                  resamples=tm.findings.bootstrap_resamples, seed=plan["findings_seed"])

    ins = [frozen["tasks"], frozen["harnesses"]]
    ch = cfg.section_hash("policy", "train", "talkmesh", "suites", "split")
    w = lambda name, rows, **kw: store.write("talkmesh", name, rows, inputs=ins, config_hash=ch, **kw)  # noqa: E731
    from tasks.talkmesh.seal import sealed_rows, sign_head

    sealed = sealed_rows(p_hash, plan["test_problems"],
                         [[(a, ok[a], c) for a, c in zip(ans, cs)] for ans, cs, ok in zip(answers, confs, oks)],
                         sealed_meshes, adapter_sha, trained_from)
    refs["talkmesh_sealed"] = w("talkmesh_sealed", sealed, extra={"plan_hash": p_hash})
    fp = sign_head(store, sealed, p_hash, signing_key)  # after the last mesh ran
    log.info("talkmesh: %d sealed rows, chain head %s signed with %s", len(sealed),
             (sealed[-1]["seal_hash"] if sealed else p_hash)[:16], fp)
    refs["talkmesh_messages"] = w("talkmesh_messages", messages)
    refs["talkmesh_results"] = w("talkmesh_results", results)
    refs["talkmesh_curves"] = w("talkmesh_curves", curves)
    refs["talkmesh_summary"] = w("talkmesh_summary", summary, extra={"timing": timing, "contrasts": contrasts})
    refs["talkmesh_calibration"] = w("talkmesh_calibration", calib)
    if tm.train_talk:
        refs["talkmesh_talk_sequences"] = w("talkmesh_talk_sequences", talk_rows,
                                            extra={"train_steps": train_steps})
    if budget:
        refs["talkmesh_budget"] = w("talkmesh_budget", budget, extra={"equal_budget": equal})
    if tm.findings is not None:
        refs["talkmesh_findings"] = w("talkmesh_findings", found)
    store.write_bytes("talkmesh/accuracy_vs_outputs.png", plot_budget_png(budget) if budget else plot_png(curves, summary))
    store.write_text("talkmesh/report.md", report_markdown(cfg, curves, summary, calib, talk_rows, train_steps, timing,
                                                           contrasts, budget=budget, findings=found,
                                                           equal_budget=equal))
    cache.clear()
    return refs


__all__ = ["run_talkmesh", "pick_problems", "poison_answer", "Grader", "Output"]
