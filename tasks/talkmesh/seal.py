"""Sealing a TalkMesh run (``harnessrl talkmesh``), so that ``harnessrl verify`` can recompute it.

The evaluate stage's seal (:mod:`tasks.evaluate.seal`) applied to P3's measurement:

1. **Plan, before the first test sample.** :func:`build_plan` lists what will be measured: the
   config's hash, the frozen tasks and harnesses (SHA-256), the test problems in order, K samples
   per problem and their seed, every mesh condition with its agents and repeats, the vote's and the
   findings' seeds and the pre-registered findings (rules, alpha, resamples). :func:`commit_plan`
   writes ``talkmesh/plan.json`` and its hash and signs the hash (Ed25519,
   :mod:`tasks.evaluate.signing`, ``talkmesh/plan.sig``) before any test proposal is drawn; a
   rerun of the same run finds the same plan, any other plan in the folder is refused.
2. **Rows, hash-chained to the plan** (:func:`sealed_rows`, contract ``talkmesh_sealed``), in the
   order they were made: one ``proposal`` row per (test problem, sample) with its graded answer
   and the confidence head's score; the ``mesh`` rows of the base-talk conditions, one per
   (condition, repeat, problem); a ``state`` row with the SHA-256 of the trained talk adapter's
   files; the trained conditions' ``mesh`` rows. The chain head is signed (``talkmesh/head.sig``).
3. **Verify** (:func:`verify_talkmesh`): the plan hash, both signatures (and the expected public
   key when given), every link of the chain, the rows against the plan one by one (nothing
   missing, added or moved), the adapter's files against the ``state`` row, and the
   ``talkmesh_findings`` table recomputed from the sealed rows with the plan's seeds
   (:func:`tasks.talkmesh.findings.finding_table` over
   :func:`tasks.talkmesh.baselines.vote_matrix`), value for value, and so is the
   ``talkmesh_curves`` table (:func:`tasks.talkmesh.baselines.vote_curves`), the vote baseline
   every mesh is read against.

What it does not cover: the other tables that only describe (messages, summary, budget,
calibration) are not recomputed; the findings and the vote curves are.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from tasks.evaluate.seal import SealError, VerifyReport, check_links, check_recomputed, plan_hash, seal_rows
from tasks.evaluate.signing import SealFiles, register_signature
from tasks.talkmesh import contracts as _contracts  # noqa: F401  (registers talkmesh_sealed)

PLAN = "talkmesh/plan.json"
PUBLIC_KEY = "talkmesh/signing.pub"
PLAN_SIG = "talkmesh/plan.sig"
HEAD_SIG = "talkmesh/head.sig"
PLAN_HASH = "talkmesh/plan.sha256"
SEALED = "talkmesh/talkmesh_sealed.parquet"
# the evaluate stage's commitment (tasks.evaluate.signing.commit_plan / sign_head), in the run's talkmesh/
TALKMESH_SEAL = SealFiles(PLAN, PLAN_HASH, PLAN_SIG, HEAD_SIG)
ADAPTER = "talkmesh/talk_adapter"
register_signature(PLAN_SIG, b"harnessrl-talkmesh-plan:", PUBLIC_KEY)
register_signature(HEAD_SIG, b"harnessrl-talkmesh-head:", PUBLIC_KEY)


def planned_conditions(tm: Any, train_talk: bool) -> list[dict[str, Any]]:
    """The mesh conditions a run evaluates on the test problems, in the order it runs them:
    ``[{"condition", "agents", "repeats", "talk"}]`` (talk ``base`` or ``trained``), as
    :func:`tasks.talkmesh.run.run_talkmesh` does: the base-talk mesh, then (with a trained talk
    policy) the trained mesh, the other mesh sizes, and the collusion conditions."""
    reps = tm.mesh_repeats or 1
    label = "trained" if train_talk else "base"
    out = [{"condition": "mesh-base", "agents": tm.agents, "repeats": reps, "talk": "base"}]
    if train_talk:
        out.append({"condition": "mesh-talk", "agents": tm.agents, "repeats": reps, "talk": label})
    word = "talk" if train_talk else "base"
    out += [{"condition": f"mesh-{word}-n{n}", "agents": n, "repeats": reps, "talk": label}
            for n in tm.mesh_sizes or []]
    out += [{"condition": f"collusion-m{m}-{d}", "agents": tm.agents, "repeats": 1, "talk": label}
            for m in tm.colluders for d in ("undefended", "defended")]
    return out


def build_plan(*, config_hash: str, tasks_sha256: str, harnesses_sha256: str, model: str, harness: str,
               test_problems: Sequence[str], samples: int, proposal_seed: int, conditions: list[dict[str, Any]],
               size_conditions: dict[int, str], vote_seed: int, resamples: int, findings: Any,
               findings_seed: int, preregistration: str | None) -> dict[str, Any]:
    """The plan of a TalkMesh run's measurement (module docstring), a JSON-able dict.

    ``size_conditions``: mesh size N -> the condition a finding about N agents reads;
    ``findings``: ``talkmesh.findings`` (None: the run has none); ``preregistration``: the freeze
    stage's signed pre-registration hash, when the run has one.
    """
    return {
        "kind": "talkmesh", "config_hash": config_hash, "tasks_sha256": tasks_sha256,
        "harnesses_sha256": harnesses_sha256, "model": model, "harness": harness,
        "test_problems": list(test_problems), "samples": int(samples), "proposal_seed": int(proposal_seed),
        "conditions": conditions, "size_conditions": {str(n): c for n, c in sorted(size_conditions.items())},
        "vote_seed": int(vote_seed), "resamples": int(resamples), "findings_seed": int(findings_seed),
        "findings": None if findings is None else {
            "alpha": findings.alpha, "bootstrap_resamples": findings.bootstrap_resamples,
            "rules": [r.model_dump() if hasattr(r, "model_dump") else dict(r) for r in findings.rules]},
        "preregistration": preregistration,
    }


def commit_plan(store: Any, plan: dict[str, Any]) -> tuple[str, Any]:
    """Write the plan and its hash and sign the hash (``talkmesh/plan.sig``) before the first test
    sample; a folder that already holds this plan (a resumed run) keeps it. Returns
    ``(plan hash, signing key)``.

    Raises:
        ValueError: the folder holds another committed plan (names both hashes).
    """
    from tasks.evaluate.signing import commit_plan as commit, load_or_create_key

    key = load_or_create_key()
    ph, _ = commit(store, TALKMESH_SEAL, plan, key, resume_as="talkmesh")
    return ph, key


def sealed_rows(p_hash: str, test_problems: Sequence[str], proposals: Sequence[Sequence[tuple[str | None, bool, float]]],
                meshes: Sequence[tuple[str, int, Sequence[dict[str, Any]]]], adapter_sha256: str | None,
                trained_from: int | None) -> list[dict[str, Any]]:
    """The chained rows of a run (module docstring, step 2).

    Args:
        proposals: per test problem (plan order), per sample: ``(answer, correct, confidence)``.
        meshes: ``(condition, repeat, results)`` in the order run, ``results`` the mesh's
            ``talkmesh_results`` rows (``problem_id``, ``answer``, ``correct``, ``outputs_spent``).
        adapter_sha256: SHA-256 of the trained talk adapter's files (None: no talk training).
        trained_from: index into ``meshes`` of the first trained-talk mesh (the ``state`` row goes
            before it); None when none is trained.
    """
    base = {"condition": None, "repeat": None, "sample": None, "answer": None, "correct": None, "confidence": None,
            "outputs_spent": None, "path": None, "sha256": None}
    rows: list[dict[str, Any]] = []
    for pid, samples in zip(test_problems, proposals):
        for s, (ans, ok, conf) in enumerate(samples):
            rows.append({**base, "kind": "proposal", "problem_id": pid, "sample": s, "answer": ans,
                         "correct": bool(ok), "confidence": float(conf)})
    for i, (cond, rep, results) in enumerate(meshes):
        if i == trained_from and adapter_sha256 is not None:
            rows.append({**base, "kind": "state", "problem_id": None, "path": ADAPTER, "sha256": adapter_sha256})
        for r in results:
            rows.append({**base, "kind": "mesh", "condition": cond, "repeat": rep, "problem_id": r["problem_id"],
                         "answer": r["answer"], "correct": bool(r["correct"]),
                         "outputs_spent": float(r["outputs_spent"])})
    return seal_rows(rows, p_hash)


def sign_head(store: Any, rows: list[dict[str, Any]], p_hash: str, key: Any) -> str:
    """Sign the chain head (``talkmesh/head.sig``); returns the key's fingerprint."""
    from tasks.evaluate.signing import sign_head as sign

    return sign(store, TALKMESH_SEAL, rows[-1]["seal_hash"] if rows else p_hash, key)


def _expected_keys(plan: dict[str, Any]) -> list[tuple]:
    """The key of every row the plan calls for, in chain order."""
    pids = plan["test_problems"]
    keys: list[tuple] = [("proposal", None, None, pid, s) for pid in pids for s in range(plan["samples"])]
    state = False
    for c in plan["conditions"]:
        if c["talk"] == "trained" and not state:
            keys.append(("state", None, None, None, None))
            state = True
        keys += [("mesh", c["condition"], r, pid, None) for r in range(c["repeats"]) for pid in pids]
    return keys


def _proposals(plan: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list, list, list]:
    """Per test problem, in the plan's order: the sealed proposals' answers, confidences and
    answer -> correct, in sealing order (the order the run voted over)."""
    at = {pid: i for i, pid in enumerate(plan["test_problems"])}
    answers: list[list[str | None]] = [[] for _ in at]
    confs: list[list[float]] = [[] for _ in at]
    oks: list[dict[str | None, bool]] = [{} for _ in at]
    for r in rows:
        if r["kind"] == "proposal":
            i = at[r["problem_id"]]
            answers[i].append(r["answer"])
            confs[i].append(r["confidence"])
            oks[i][r["answer"]] = bool(r["correct"])
    return answers, confs, oks


def recompute_curves(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``talkmesh_curves`` rows (majority and confidence-weighted vote, k = 1..K) from the
    sealed proposals and the plan's K, orderings and seed, as the run computes them."""
    from tasks.talkmesh.baselines import vote_curves

    answers, confs, oks = _proposals(plan, rows)
    return vote_curves(answers, confs, oks, k_max=plan["samples"], resamples=plan["resamples"],
                       seed=plan["vote_seed"])


def recompute_findings(plan: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``talkmesh_findings`` rows from the sealed rows and the plan, as the run computes
    them (:func:`tasks.talkmesh.run.run_talkmesh`): the vote over the proposals' answers and
    confidences, each finding's mesh per problem averaged over its repeats. [] when the plan has
    no findings."""
    from tasks.talkmesh.baselines import vote_matrix
    from tasks.talkmesh.findings import finding_table

    if not plan.get("findings"):
        return []
    pids = plan["test_problems"]
    answers, confs, oks = _proposals(plan, rows)
    got: dict[tuple[str, int], dict[str, bool]] = {}
    for r in rows:
        if r["kind"] == "mesh":
            got.setdefault((r["condition"], r["repeat"]), {})[r["problem_id"]] = bool(r["correct"])
    votes = vote_matrix(answers, confs, oks, k_max=plan["samples"], resamples=plan["resamples"],
                        seed=plan["vote_seed"])
    reps = {c["condition"]: c["repeats"] for c in plan["conditions"]}
    meshes = {}
    for n, cond in plan["size_conditions"].items():
        acc = [0.0] * len(pids)
        for r in range(reps[cond]):
            acc = [a + got[(cond, r)][pid] / reps[cond] for a, pid in zip(acc, pids)]
        meshes[int(n)] = (cond, acc)
    f = plan["findings"]
    rules = [SimpleNamespace(**r) for r in f["rules"]]
    return finding_table(rules, meshes, votes["majority"], alpha=f["alpha"], resamples=f["bootstrap_resamples"],
                         seed=plan["findings_seed"])


def verify_talkmesh(store: Any, public_key: bytes | None = None) -> VerifyReport:
    """Recompute a sealed TalkMesh run from its files (module docstring, step 3); the report's
    ``fingerprint`` is the signing key's.

    Raises:
        NotARunError: no committed plan or sealed rows, or they cannot be read.
        SealError: the plan, a signature, a row, the adapter's files or the findings table changed
            or is missing (the message names the first difference).
    """
    from schemas import ArtifactError
    from tasks.evaluate.signing import check_signatures
    from tasks.evaluate.verify import NotARunError
    from tasks.hashing import sha256_dir

    for rel in (PLAN, PLAN_HASH, SEALED):
        if not store.exists(rel):
            raise NotARunError(f"{store.url}: not a sealed TalkMesh run ({rel} is missing)")
    try:
        plan = store.read_json(PLAN)
        committed = store.read_bytes(PLAN_HASH).decode("ascii").strip()
        rows = store.raw_rows("talkmesh", "talkmesh_sealed")
    except (ValueError, UnicodeDecodeError, ArtifactError) as e:
        raise NotARunError(f"{store.url}/talkmesh: unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    ph = plan_hash(plan)
    if ph != committed:
        raise SealError(f"{PLAN}: hash {ph[:16]}... != committed {committed[:16]}... (the plan was edited)")
    head = check_links(rows, ph, lambda r: f"{r.get('kind')} {r.get('condition') or ''} {r.get('problem_id')}")
    fp = check_signatures(store, ph, head, public_key, sigs=(TALKMESH_SEAL.plan_sig, TALKMESH_SEAL.head_sig))
    want = _expected_keys(plan)
    for i, (row, key) in enumerate(zip(rows, want)):
        have = (row.get("kind"), row.get("condition"), row.get("repeat"), row.get("problem_id"), row.get("sample"))
        if have != key:
            raise SealError(f"row {i}: {have} where the plan calls for {key}")
    if len(rows) != len(want):
        raise SealError(f"{SEALED}: {len(rows)} rows, the plan calls for {len(want)}")
    for row in rows:
        if row["kind"] == "state":
            with tempfile.TemporaryDirectory() as tmp:
                now = sha256_dir(store.get_dir(row["path"], Path(tmp) / "adapter"))
            if now != row["sha256"]:
                raise SealError(f"{row['path']}: files hash {now[:16]}... != sealed {row['sha256'][:16]}... (the talk "
                                "adapter changed after the meshes ran)")
    if plan.get("preregistration"):
        from tasks.evaluate.signing import PREREG_SIG, check_signature

        check_signature(store, PREREG_SIG, plan["preregistration"], public_key)  # by the expected key, if given
    expected = recompute_findings(plan, rows)
    if expected:
        try:
            found = store.raw_rows("talkmesh", "talkmesh_findings")
        except ArtifactError as e:
            raise SealError(f"talkmesh/talkmesh_findings.parquet: {str(e).splitlines()[0]}") from None
        check_recomputed("talkmesh/talkmesh_findings.parquet", found, expected)
    try:
        curves = store.raw_rows("talkmesh", "talkmesh_curves")
    except ArtifactError as e:
        raise SealError(f"talkmesh/talkmesh_curves.parquet: {str(e).splitlines()[0]}") from None
    check_recomputed("talkmesh/talkmesh_curves.parquet", curves, recompute_curves(plan, rows))
    manifest = store.manifest("talkmesh", "talkmesh_sealed")
    if hashlib.sha256(store.read_bytes(SEALED)).hexdigest() != manifest.get("sha256"):
        raise SealError(f"{SEALED}: differs from its manifest")
    return VerifyReport(plan_hash=ph, rows=len(rows), head=head, fingerprint=fp)


__all__ = ["planned_conditions", "build_plan", "commit_plan", "sealed_rows", "sign_head", "recompute_findings",
           "recompute_curves",
           "verify_talkmesh", "PLAN", "PLAN_HASH", "SEALED"]
