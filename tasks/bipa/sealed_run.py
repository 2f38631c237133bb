"""P2's sealed, pre-registered measurement (a ``harnessrl bipa`` config with ``bipa.findings``).

1. **Plan, before the first sample** (:func:`build_plan`): the config hash, the frozen tables'
   SHA-256, the seed harness and its skill's hash, the selection and test tasks in order, the
   samples per task, each set's seed, the rule, the hand-written pool and the placebo (names,
   texts and SHA-256), the rewrite arm (optimizer seeds, rounds, proposal seeds, the proposer's
   sampling) and the claims. Committed and signed (Ed25519, ``bipa/plan.sig``) before any
   episode; a resumed run finds the same plan, another plan in the folder is refused.
2. **Steps**, each one batch through the rollout runner (:func:`tasks.rollout.runner.run_records`,
   every candidate of the step in one call): ``pool`` (the seed, the pool and the placebo on the
   selection tasks), ``round<k>`` (one rewrite per optimizer seed of its incumbent, all in one
   generate call, then every new rewrite on the selection tasks), ``fresh`` (every candidate on
   fresh samples of the selection tasks) and ``test`` (every candidate on the held-out tasks).
   Every record carries a noise key ``<set>:<task_id>``, so on a set all candidates draw the same
   sampler noise per (task, sample, turn): common random numbers
   (:func:`tasks.rollout.harness.request_seeds`). A step's rows are saved to
   ``bipa/steps/<step>.json`` when it ends (with its seconds; their sum is ``bipa/timing.json``);
   a killed run resumes at the first unsaved step.
3. **Seal**: the rows hash-chained to the plan (contract ``bipa_sealed``), the head signed
   (``bipa/head.sig``); ``bipa_findings`` (:func:`tasks.bipa.claims.finding_table`) and
   ``bipa_gains`` computed from those rows; ``bipa/report.md``.
4. **Verify** (:func:`verify_bipa`): plan hash, signatures, chain, the candidate rows against the
   plan (pool texts and hashes, every optimizer seed and round, each rewrite's parent the
   incumbent the selection rows make), every planned episode present once, and both tables
   recomputed from the sealed rows value for value.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from tasks.bipa import contracts as _contracts  # noqa: F401  (registers bipa_sealed and the findings tables)
from tasks.evaluate.seal import SealError, VerifyReport, check_links, check_recomputed, plan_hash, seal_rows
from tasks.evaluate.signing import SealFiles, register_signature
from tasks.hashing import seed_from, sha256_text

log = logging.getLogger("harnessrl.bipa")

PLAN = "bipa/plan.json"
PLAN_HASH = "bipa/plan.sha256"
PUBLIC_KEY = "bipa/signing.pub"
SEALED = "bipa/bipa_sealed.parquet"
BIPA_SEAL = SealFiles(PLAN, PLAN_HASH, "bipa/plan.sig", "bipa/head.sig")
register_signature(BIPA_SEAL.plan_sig, b"harnessrl-bipa-plan:", PUBLIC_KEY)
register_signature(BIPA_SEAL.head_sig, b"harnessrl-bipa-head:", PUBLIC_KEY)
ROW = {"name": None, "arm": None, "opt_seed": None, "round": None, "parent": None, "skill": None,
       "skill_sha256": None, "harness_id": None, "score_set": None, "task_id": None, "sample": None, "reward": None,
       "success": None, "status": None, "input_tokens": None, "turns": None}


def build_plan(cfg: Any, store: Any, frozen: dict[str, Any], seed_skill: str, sel_ids: list[str],
               test_ids: list[str]) -> dict[str, Any]:
    """The plan (module docstring, step 1), a JSON-able dict."""
    b, f = cfg.bipa, cfg.bipa.findings
    pool = [{"name": e.name, "arm": "pool", "text": e.text, "sha256": sha256_text(e.text)} for e in f.edits]
    pool.append({"name": f.placebo.name, "arm": "placebo", "text": f.placebo.text, "sha256": sha256_text(f.placebo.text)})
    return {
        "kind": "bipa", "config_hash": cfg.config_hash(),
        "tasks_sha256": frozen["tasks"].sha256, "harnesses_sha256": frozen["harnesses"].sha256,
        "model": cfg.policy.model, "harness": cfg.seed_harness_name(), "seed_skill_sha256": sha256_text(seed_skill),
        "selection_tasks": sel_ids, "test_tasks": test_ids, "samples": b.samples,
        "set_seeds": {s: seed_from(cfg.seed, "bipa", s) for s in ("selection", "fresh", "test")},
        "accept": {"better_by": b.accept.better_by}, "pool": pool,
        "rewrite": {"seeds": list(f.rewrite_seeds), "rounds": f.rewrite_rounds,
                    "proposal_seeds": [seed_from(cfg.seed, "bipa", "round", k) for k in range(1, f.rewrite_rounds + 1)],
                    "sampling": b.proposer_sampling.model_dump(), "max_skill_chars": b.max_skill_chars,
                    "proposer": None if b.proposer is None else b.proposer.model_dump()},
        "findings": {"alpha": f.alpha, "bootstrap_resamples": f.bootstrap_resamples,
                     "seed": seed_from(cfg.seed, "bipa", "findings"), "rules": [r.model_dump() for r in f.rules]},
    }


def _records(specs: dict[str, Any], tasks: list[dict[str, Any]], score_set: str, seed: int) -> list[dict[str, Any]]:
    from tasks.bipa.optimizer import spec_records

    out = []
    for spec in specs.values():
        for r in spec_records(spec, tasks, seed):
            out.append({**r, "noise_key": f"{score_set}:{r['task_id']}"})
    return out


def score_batch(policy: Any, cfg: Any, specs: dict[str, Any], tasks: list[dict[str, Any]], score_set: str,
                plan: dict[str, Any]) -> list[dict[str, Any]]:
    """One :func:`tasks.rollout.runner.run_records` call: every spec of ``specs`` (harness_id ->
    spec) on ``tasks`` x the plan's samples, with the set's seed and common random numbers.
    Returns the ``episode`` rows (unsealed), in the runner's order."""
    from tasks.rollout.runner import run_records

    if not specs:
        return []
    seed = plan["set_seeds"][score_set]
    eps, _ = run_records(policy, cfg, specs, {t["task_id"]: t for t in tasks}, _records(specs, tasks, score_set, seed),
                         plan["samples"], seed, f"bipa-{score_set}")
    bad = sum(e["status"] == "infra_error" for e in eps)
    if bad:
        log.warning("bipa %s: %d of %d episodes ended with infra_error (scored 0)", score_set, bad, len(eps))
    return [{**ROW, "kind": "episode", "score_set": score_set, "harness_id": e["record"]["harness_id"],
             "task_id": e["record"]["task_id"], "sample": int(e["sample_idx"]), "reward": float(e["reward"]),
             "success": bool(e["success"]), "status": e["status"], "input_tokens": int(e["input_tokens"]),
             "turns": int(e["num_turns"])} for e in eps]


def _candidate(name: str, arm: str, text: str, spec: Any, parent: str | None, opt_seed: int | None = None,
               rnd: int | None = None) -> dict[str, Any]:
    return {**ROW, "kind": "candidate", "name": name, "arm": arm, "opt_seed": opt_seed, "round": rnd,
            "parent": parent, "skill": text, "skill_sha256": sha256_text(text),
            "harness_id": None if spec is None else spec.harness_id}


def _step(store: Any, name: str, run: Any) -> list[dict[str, Any]]:
    """The rows of step ``name``: read from ``bipa/steps/<name>.json`` when a run got that far,
    else computed by ``run()`` and saved there (atomically) before the next step starts."""
    import time

    rel = f"bipa/steps/{name}.json"
    if store.exists(rel):
        log.info("bipa: step %s resumed from %s", name, rel)
        return store.read_json(rel)["rows"]
    t0 = time.perf_counter()
    rows = run()
    store.write_json(rel, {"rows": rows, "seconds": round(time.perf_counter() - t0, 3)})
    return rows


def run_sealed(store: Any, cfg: Any, frozen: dict[str, Any], policy: Any, proposer: Any = None) -> dict[str, Any]:
    """Plan, steps, seal, findings and report (module docstring). ``policy`` generates the
    episodes (it must take per-request seeds); ``proposer`` the rewrites (None: ``policy``).
    Returns the refs of ``bipa_sealed``, ``bipa_findings`` and ``bipa_gains``.

    Raises:
        ValueError: too few train or test tasks, the seed harness not frozen, or the folder holds
            another committed plan.
    """
    from tasks.bipa.claims import cell_means, decisions, finding_table, gain_rows, incumbent
    from tasks.bipa.optimizer import PROPOSER_SYSTEM, PROPOSER_USER, _split_tasks, clean_proposal, seed_harness_spec
    from tasks.evaluate.signing import commit_plan, load_or_create_key, sign_head
    from tasks.rollout.generation import ChatFormat

    proposer = proposer if proposer is not None else policy
    sel_tasks, test_tasks = _split_tasks(store, frozen, cfg)
    seed_spec = seed_harness_spec(store, frozen, cfg)
    plan = build_plan(cfg, store, frozen, seed_spec.skill or "", [t["task_id"] for t in sel_tasks],
                      [t["task_id"] for t in test_tasks])
    key = load_or_create_key()
    ph, _ = commit_plan(store, BIPA_SEAL, plan, key, resume_as="bipa")

    def spec_of(text: str) -> Any:
        return seed_spec.model_copy(update={"skill": text})

    def pool_step() -> list[dict[str, Any]]:
        rows = [_candidate("seed", "seed", seed_spec.skill or "", seed_spec, None)]
        specs = {seed_spec.harness_id: seed_spec}
        for p in plan["pool"]:
            s = spec_of(p["text"])
            specs[s.harness_id] = s
            rows.append(_candidate(p["name"], p["arm"], p["text"], s, "seed"))
        return rows + score_batch(policy, cfg, specs, sel_tasks, "selection", plan)

    rows = _step(store, "pool", pool_step)
    rw = plan["rewrite"]
    chat = ChatFormat(proposer.tokenizer)
    for k in range(1, rw["rounds"] + 1):
        def round_step(k: int = k) -> list[dict[str, Any]]:
            from tasks.harnesses.spec import SamplingSpec

            cands = decisions(plan, rows)
            incs = [incumbent(cands, s) for s in rw["seeds"]]
            skills = {r["name"]: r["skill"] for r in rows if r["kind"] == "candidate"}
            sel = cell_means(rows)
            prompts = [chat.initial(PROPOSER_SYSTEM, PROPOSER_USER.format(
                mean=_mean(sel[("selection", c["harness_id"], "reward")]), skill=skills[c["name"]])) for c in incs]
            gens = proposer.generate(prompts, SamplingSpec(**rw["sampling"]), rw["proposal_seeds"][k - 1])
            out, specs = [], {}
            scored = {r["harness_id"] for r in rows if r["kind"] == "episode" and r["score_set"] == "selection"}
            for s, c, g in zip(rw["seeds"], incs, gens):
                text = clean_proposal(g.text, rw["max_skill_chars"])
                spec = spec_of(text) if text else None
                out.append(_candidate(f"rewrite-s{s}-r{k}", "rewrite", text, spec, c["name"], s, k))
                if spec is not None and spec.harness_id not in scored:
                    specs[spec.harness_id] = spec
            return out + score_batch(policy, cfg, specs, sel_tasks, "selection", plan)

        rows = rows + _step(store, f"round{k}", round_step)

    every = {}
    for r in rows:
        if r["kind"] == "candidate" and r["harness_id"] is not None:
            every[r["harness_id"]] = spec_of(r["skill"]) if r["arm"] != "seed" else seed_spec
    rows = rows + _step(store, "fresh", lambda: score_batch(policy, cfg, every, sel_tasks, "fresh", plan))
    rows = rows + _step(store, "test", lambda: score_batch(policy, cfg, every, test_tasks, "test", plan))

    steps = ["pool"] + [f"round{k}" for k in range(1, rw["rounds"] + 1)] + ["fresh", "test"]
    secs = {st: store.read_json(f"bipa/steps/{st}.json").get("seconds") for st in steps}
    store.write_json("bipa/timing.json", {"steps": secs, "seconds": sum(v or 0.0 for v in secs.values())})
    sealed = seal_rows(rows, ph)
    ch = cfg.config_hash()
    ins = [frozen["tasks"], frozen["harnesses"]]
    findings = finding_table(plan, sealed)
    gains = gain_rows(plan, sealed)
    refs = {"bipa_sealed": store.write("bipa", "bipa_sealed", sealed, inputs=ins, config_hash=ch),
            "bipa_findings": store.write("bipa", "bipa_findings", findings, inputs=ins, config_hash=ch),
            "bipa_gains": store.write("bipa", "bipa_gains", gains, inputs=ins, config_hash=ch)}
    sign_head(store, BIPA_SEAL, sealed[-1]["seal_hash"] if sealed else ph, key)
    from tasks.bipa.findings_report import findings_markdown

    store.write_text("bipa/report.md", findings_markdown(cfg, plan, decisions(plan, sealed), findings, gains))
    return refs


def _mean(d: dict[str, float]) -> float:
    import math

    return math.fsum(d.values()) / len(d)


def _check_candidates(plan: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The candidate rows against the plan and the recomputed decisions (SealError on the first
    difference)."""
    from tasks.bipa.claims import decisions, incumbent

    cands = [r for r in rows if r["kind"] == "candidate"]
    for r in cands:
        if r["skill"] is None or sha256_text(r["skill"]) != r["skill_sha256"]:
            raise SealError(f"candidate {r['name']!r}: its skill text does not hash to {str(r['skill_sha256'])[:16]}")
    head = [(r["name"], r["arm"], r["skill_sha256"]) for r in cands[: len(plan["pool"]) + 1]]
    want = [("seed", "seed", plan["seed_skill_sha256"])] + [(p["name"], p["arm"], p["sha256"]) for p in plan["pool"]]
    if head != want:
        raise SealError(f"candidates: {head} where the plan fixes {want}")
    rw = plan["rewrite"]
    got = [(r["opt_seed"], r["round"]) for r in cands[len(want):]]
    exp = [(s, k) for k in range(1, rw["rounds"] + 1) for s in rw["seeds"]]
    if got != exp:
        raise SealError(f"rewrites: (seed, round) {got} where the plan calls for {exp}")
    dec = decisions(plan, rows)
    for r in cands[len(want):]:
        inc = incumbent([c for c in dec if not (c["arm"] == "rewrite" and c["round"] >= r["round"])], r["opt_seed"])
        if r["parent"] != inc["name"]:
            raise SealError(f"candidate {r['name']!r}: parent {r['parent']!r}, the selection rows make {inc['name']!r} "
                            "its incumbent")


def _check_episodes(plan: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Every planned (set, harness, task, sample) has exactly one episode row, and no other."""
    hids = {r["harness_id"] for r in rows if r["kind"] == "candidate" and r["harness_id"]}
    want = {(s, h, t, i) for h in hids for s, ts in (("selection", plan["selection_tasks"]),
                                                      ("fresh", plan["selection_tasks"]), ("test", plan["test_tasks"]))
            for t in ts for i in range(plan["samples"])}
    seen: set = set()
    for r in rows:
        if r["kind"] != "episode":
            continue
        k = (r["score_set"], r["harness_id"], r["task_id"], r["sample"])
        if k not in want or k in seen:
            raise SealError(f"episode {k}: {'not in the plan' if k not in want else 'appears twice'}")
        seen.add(k)
    if want - seen:
        raise SealError(f"{len(want - seen)} planned episode(s) have no row, e.g. {sorted(want - seen)[0]}")


def verify_bipa(store: Any, public_key: bytes | None = None) -> VerifyReport:
    """Recompute a sealed BiPA run from its files (module docstring, step 4).

    Raises:
        NotARunError: no committed plan or sealed rows, or they cannot be read.
        SealError: the plan, a signature, a row or a recomputed table differs (names the first).
    """
    from schemas import ArtifactError
    from tasks.bipa.claims import finding_table, gain_rows
    from tasks.evaluate.signing import check_signatures
    from tasks.evaluate.verify import NotARunError

    for rel in (PLAN, PLAN_HASH, SEALED):
        if not store.exists(rel):
            raise NotARunError(f"{store.url}: not a sealed BiPA run ({rel} is missing)")
    try:
        plan = store.read_json(PLAN)
        committed = store.read_bytes(PLAN_HASH).decode("ascii").strip()
        rows = store.raw_rows("bipa", "bipa_sealed")
    except (ValueError, UnicodeDecodeError, ArtifactError) as e:
        raise NotARunError(f"{store.url}/bipa: unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    ph = plan_hash(plan)
    if ph != committed:
        raise SealError(f"{PLAN}: hash {ph[:16]}... != committed {committed[:16]}... (the plan was edited)")
    head = check_links(rows, ph, lambda r: f"{r.get('kind')} {r.get('name') or r.get('score_set')} {r.get('task_id')}")
    fp = check_signatures(store, ph, head, public_key, sigs=(BIPA_SEAL.plan_sig, BIPA_SEAL.head_sig))
    _check_candidates(plan, rows)
    _check_episodes(plan, rows)
    for table, fn in (("bipa_findings", finding_table), ("bipa_gains", gain_rows)):
        try:
            found = store.raw_rows("bipa", table)
        except ArtifactError as e:
            raise SealError(f"bipa/{table}.parquet: {str(e).splitlines()[0]}") from None
        check_recomputed(f"bipa/{table}.parquet", found, fn(plan, rows))
    if hashlib.sha256(store.read_bytes(SEALED)).hexdigest() != store.manifest("bipa", "bipa_sealed").get("sha256"):
        raise SealError(f"{SEALED}: differs from its manifest")
    return VerifyReport(plan_hash=ph, rows=len(rows), head=head, fingerprint=fp)
