"""TalkMesh as a harness family of the pipeline (P3: docs/methods/p3-talkmesh.md): episodes, the confidence head as a
rollout artifact, and the talk policy's training sequences.

A harness with ``loop_type: talkmesh`` (:class:`tasks.talkmesh.harness_block.MeshSpec`) is not run by the
harness engine. Its pieces are those of the ``harnessrl talkmesh`` command, reused as they are:
:func:`tasks.talkmesh.mesh.run_mesh`, :class:`tasks.talkmesh.calibration.HiddenStates` /
:func:`~tasks.talkmesh.calibration.fit_head`, :class:`tasks.talkmesh.talk.LMTalk` and
:func:`tasks.talkmesh.talk.talk_sequences`.

- **Head** (:func:`fit_heads`, rollout stage): ``mesh.head_samples`` base-policy proposals per
  train task (the harness's prompt and ``sampling``; one engine call seeded by
  ``seed_from(cfg.seed, "talkmesh-head", harness_id)``), graded by the task's verifier, fitted on
  the base model's hidden states (float32, CPU) with ``seed_from(cfg.seed, "head", harness_id)``.
  Written as the ``talkmesh_head`` table (its SHA-256 identifies it) with one
  ``talkmesh_calibration`` table per harness (train split: ECE, Brier, reliability bins).
- **Episode** (:func:`run_mesh_records`): one mesh run of ``mesh.agents`` agents on one task. All
  records of a harness with the same sample index s form one batched :func:`run_mesh` call:
  proposals seeded by ``seed_from(seed, tag, harness_id, "proposals", s)``, talk by
  ``seed_from(seed, tag, harness_id, "talk", s)``, the topology by ``seed_from(seed, tag,
  harness_id, "topology")``. Episode ids and recorded seeds are those of the engine
  (:func:`tasks.rollout.fanout.episode_jobs`: content hashes of record, tag, policy, sample, seed).
  reward = 1.0 iff the mesh's consensus answer is graded correct; ``final_answer`` = that answer;
  ``num_turns`` = messages the agents wrote with the model.
- **Turns**: one row per model-written message, in the order written (the N proposals, then per
  round the hints, then the revisions). Each is a *separate* call: every row stores that message's
  whole prompt (``prompt_continues`` false, :func:`tasks.rollout.turns.first_turn`), not an
  extension of the previous turn (unlike engine episodes, so
  :func:`tasks.train.sequences.build_sequences` refuses them). ``action`` is canonical JSON
  ``{"kind": proposal|hint|revision, "agent", "round", "talk_reward", "answer", ...}``; a
  revision also carries ``hint_turn`` (the turn_idx of the hint it answered), ``proposal_correct``,
  ``correct`` and ``kept``. talk_reward (talk.py): revision 1[revision correct] - 1[proposal
  correct]; hint: the mean over the revisions it caused (null if none); proposal: null.
- **Training** (:func:`talk_train_sequences`): the hint and revision turns of the episodes back
  into :func:`talk_sequences`'s input, so the train stage's batch is the talk policy's GRPO batch.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

from tasks.harnesses.spec import HarnessSpec
from tasks.hashing import canonical_json, seed_from
from tasks.rollout.turns import first_turn, iter_prompts, prompt_lengths
from tasks.talkmesh import contracts as _contracts  # noqa: F401  (registers the talkmesh_* contracts)
from tasks.talkmesh.mesh import MeshSettings, Output, Problem, run_mesh

log = logging.getLogger("harnessrl.talkmesh")

KINDS = ("proposal", "hint", "revision")


def is_mesh(spec: HarnessSpec) -> bool:
    """Whether ``spec`` is a TalkMesh harness (episodes run by this module, not the engine)."""
    return spec.loop_type == "talkmesh"


def is_mesh_turn(action_json: str | None) -> bool:
    """Whether a ``turns.action`` value is a TalkMesh message (has ``talk_reward``)."""
    if not action_json or '"talk_reward"' not in action_json:
        return False
    try:
        a = json.loads(action_json)
    except json.JSONDecodeError:
        return False
    return isinstance(a, dict) and "talk_reward" in a and a.get("kind") in KINDS


def _s31(*parts: Any) -> int:
    return seed_from(*parts) % 2**31


def _problem(task: dict[str, Any]) -> Problem:
    return Problem(task["task_id"], task["instruction"], task["verifier_kind"], task["verifier_spec"])


class _Recording:
    """A policy proxy that keeps the finish reasons of the last ``generate`` call, so that every
    message's turn row gets the engine's own ``finish_reason``."""

    def __init__(self, policy: Any):
        self._policy = policy
        self.tokenizer = policy.tokenizer
        self.last: list[str] = []

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int) -> Any:
        gens = self._policy.generate(prompts, sampling, seed)
        self.last = [g.finish_reason for g in gens]
        return gens

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


class _TalkLog:
    """The talk policy seen by :func:`run_mesh`: :class:`LMTalk`'s hints and revisions, logged per
    call with the inputs, outputs and finish reasons (a round is one ``hints`` call, then at most
    one ``revise`` call)."""

    def __init__(self, talk: Any, rec: _Recording):
        self.talk, self.rec = talk, rec
        self.calls: list[tuple[str, list[Any], list[Output], list[str]]] = []

    def hints(self, items: Sequence[tuple[Problem, Output]], seed: int) -> list[Output]:
        outs = self.talk.hints(items, seed)
        self.calls.append(("hint", list(items), list(outs), list(self.rec.last)))
        return outs

    def revise(self, items: Sequence[tuple[Problem, Output, str]], seed: int) -> list[Output]:
        outs = self.talk.revise(items, seed)
        self.calls.append(("revision", list(items), list(outs), list(self.rec.last)))
        return outs


def mesh_settings(spec: HarnessSpec, topology_seed: int) -> MeshSettings:
    """The :class:`MeshSettings` of a talkmesh spec. Raises ValueError for a spec without ``mesh``."""
    m = spec.mesh
    if m is None:
        raise ValueError(f"harness {spec.name!r} has no mesh section (loop_type {spec.loop_type})")
    return MeshSettings(agents=m.agents, topology=m.topology, degree=m.degree, rounds=m.rounds,
                        threshold=m.threshold, seed=topology_seed)


def _talk(policy: Any, spec: HarnessSpec) -> tuple[Any, _Recording]:
    from tasks.talkmesh.talk import LMTalk

    rec = _Recording(policy)
    assert spec.mesh is not None
    return LMTalk(rec, spec, spec.sampling, spec.mesh.talk_sampling, spec.mesh.max_solution_chars), rec


class HeadScorer:
    """The confidence scorer of one harness: its fitted head on the base model's hidden states.

    Args:
        head: a :class:`tasks.talkmesh.calibration.ConfidenceHead`.
        hidden: a :class:`tasks.talkmesh.calibration.HiddenStates` of the base model with the
            harness's system prompt.
    """

    def __init__(self, head: Any, hidden: Any):
        self.head, self.hidden = head, hidden

    def __call__(self, items: Sequence[tuple[Problem, str | None]]) -> list[float]:
        items = list(items)
        return self.head.predict(self.hidden([(p.question, a) for p, a in items])) if items else []


def hidden_states(cfg: Any, spec: HarnessSpec) -> Any:
    """:class:`HiddenStates` of the run's base model (float32, CPU, as in :mod:`tasks.talkmesh.run`)."""
    from tasks.rollout.models import load_model_and_tokenizer, resolve_model
    from tasks.talkmesh.calibration import HiddenStates

    model, tok = load_model_and_tokenizer(resolve_model(cfg.policy.model, cfg.policy.cache_dir), "cpu", "float32")
    assert spec.mesh is not None
    return HiddenStates(model, tok, spec.system_prompt, batch_size=spec.mesh.head.batch_size)


def fit_heads(policy: Any, cfg: Any, specs: dict[str, HarnessSpec], tasks: dict[str, dict[str, Any]],
              records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Fit the confidence head of every talkmesh harness among ``records`` (module docstring).

    Args:
        policy: the loaded base policy (``generate``, ``tokenizer``).
        records: train-split records; each talkmesh harness's train tasks are its records' tasks.

    Returns:
        ``(head rows, {harness name: calibration rows})``: ``talkmesh_head`` rows by harness name
        and ``talkmesh_calibration`` rows (split ``train``).

    Raises:
        ValueError: no proposal of a harness has a parsable answer (nothing to fit on).
    """
    from tasks.rollout.models import model_id, resolve_model
    from tasks.talkmesh.calibration import fit_head
    from tasks.talkmesh.run import Grader, calibration_rows

    grader = Grader()
    heads: list[dict[str, Any]] = []
    calib: dict[str, list[dict[str, Any]]] = {}
    base_id = model_id(resolve_model(cfg.policy.model, cfg.policy.cache_dir))
    for hid in sorted({r["harness_id"] for r in records if is_mesh(specs[r["harness_id"]])},
                      key=lambda h: (specs[h].name, h)):
        spec = specs[hid]
        assert spec.mesh is not None
        m = spec.mesh
        probs = [_problem(tasks[r["task_id"]]) for r in sorted((r for r in records if r["harness_id"] == hid),
                                                               key=lambda r: r["record_id"])]
        talk, _ = _talk(policy, spec)
        props = talk.propose(probs, m.head_samples, _s31(cfg.seed, "talkmesh-head", hid))
        items = [(p, o.answer) for p, row in zip(probs, props) for o in row if o.answer is not None]
        if not items:
            raise ValueError(f"talkmesh harness {spec.name!r}: none of the {len(probs) * m.head_samples} head "
                             "proposals has a parsable answer; the confidence head cannot be fitted")
        labels = [grader(p, a) for p, a in items]
        hs = hidden_states(cfg, spec)
        seed = _s31(cfg.seed, "head", hid)
        head = fit_head(hs([(p.question, a) for p, a in items]), labels, l2=m.head.l2, steps=m.head.steps, seed=seed)
        conf = HeadScorer(head, hs)(items)
        rows = calibration_rows("train", conf, labels, m.head.bins)
        calib[spec.name] = rows
        heads.append({"harness_id": hid, "harness_name": spec.name, "base_model_id": base_id,
                      "weight": [float(x) for x in head.weight], "bias": float(head.bias),
                      "mean": [float(x) for x in head.mean], "std": [float(x) for x in head.std],
                      "n": len(items), "positives": int(sum(labels)), "l2": m.head.l2, "steps": m.head.steps,
                      "seed": seed, "ece": rows[0]["ece"], "brier": rows[0]["brier"]})
        log.info("talkmesh %s: head on %d graded proposals (%d correct), ECE %.3f", spec.name, len(items),
                 sum(labels), rows[0]["ece"])
    return heads, calib


def heads_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``talkmesh_head`` rows -> {harness_id: ConfidenceHead} (float32 tensors, exactly as fitted)."""
    import torch

    from tasks.talkmesh.calibration import ConfidenceHead

    return {r["harness_id"]: ConfidenceHead(weight=torch.tensor(r["weight"], dtype=torch.float32), bias=r["bias"],
                                            mean=torch.tensor(r["mean"], dtype=torch.float32),
                                            std=torch.tensor(r["std"], dtype=torch.float32)) for r in rows}


def _turn(eid: str, idx: int, out: Output, finish: str, action: dict[str, Any]) -> dict[str, Any]:
    return {"episode_id": eid, "turn_idx": idx, **first_turn(out.prompt_ids),
            "completion_token_ids": list(out.token_ids), "completion_logprobs": list(out.logprobs),
            "loss_mask": [1] * len(out.token_ids), "completion_text": out.text, "finish_reason": finish,
            "action": canonical_json(action), "observation": "", "read_spans": ""}


def run_mesh_records(policy: Any, cfg: Any, spec: HarnessSpec, harness_id: str, tasks: dict[str, dict[str, Any]],
                     records: list[dict[str, Any]], samples: int, seed: int, tag: str, head: Any, hidden: Any
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Episodes of one talkmesh harness: ``samples`` mesh runs per record (module docstring).

    Args:
        policy: a loaded policy (``generate``, ``tokenizer``, ``policy_id``): writes every message.
        records: this harness's records; run in ``record_id`` order.
        head / hidden: the harness's fitted head and the base model's :class:`HiddenStates`.

    Returns:
        ``(episodes, turns)`` as :func:`tasks.rollout.runner.run_records` returns them (episode dicts
        with ``record``, ``sample_idx``, ``seed``, ``policy_id``), in (record id, sample) order.

    Raises:
        ValueError: a record of another harness, or ``samples`` < 1.
    """
    from tasks.rollout.fanout import episode_jobs
    from tasks.talkmesh.run import Grader
    from tasks.talkmesh.talk import revision_reward

    if samples < 1:
        raise ValueError(f"samples={samples}: need at least one episode per record")
    bad = [r["record_id"] for r in records if r["harness_id"] != harness_id]
    if bad:
        raise ValueError(f"run_mesh_records: records {bad[:3]} are not of harness {spec.name!r}")
    recs = sorted(records, key=lambda r: r["record_id"])
    jobs = episode_jobs(recs, tasks, samples, seed, tag, policy.policy_id)
    job = {(j.record["record_id"], j.sample_idx): j for j in jobs}
    probs = [_problem(tasks[r["task_id"]]) for r in recs]
    settings = mesh_settings(spec, _s31(seed, tag, harness_id, "topology"))
    n = settings.agents
    grader = Grader()
    score = HeadScorer(head, hidden)
    done: dict[tuple[str, int], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for s in range(samples):
        talk, rec = _talk(policy, spec)
        props = talk.propose(probs, n, _s31(seed, tag, harness_id, "proposals", s))
        prop_finish = rec.last  # flat order: sample j of problem i at j * P + i
        tl = _TalkLog(talk, rec)
        res = run_mesh(probs, props, score, tl, grader, settings, seed=_s31(seed, tag, harness_id, "talk", s))
        rev_reward = {id(r["revision"]): (revision_reward(r["proposal_correct"], r["revision_correct"]), r)
                      for r in res.revisions}
        hint_rewards: dict[int, list[float]] = {}
        for r in res.revisions:
            hint_rewards.setdefault(id(r["hint"]), []).append(revision_reward(r["proposal_correct"],
                                                                              r["revision_correct"]))
        kept = {(m["problem_id"], m["agent"], m["round"]): m["kept"] for m in res.messages}
        for k, (r, p) in enumerate(zip(recs, probs)):
            j = job[(r["record_id"], s)]
            owner: dict[int, int] = {}
            turns: list[dict[str, Any]] = []
            for i in range(n):
                owner[id(props[k][i])] = i
                turns.append(_turn(j.episode_id, len(turns), props[k][i], prop_finish[i * len(probs) + k],
                                   {"kind": "proposal", "agent": i, "round": 0, "talk_reward": None,
                                    "answer": props[k][i].answer}))
            rnd = 0
            hint_turn: dict[int, int] = {}
            for kind, items, outs, finish in tl.calls:
                if kind == "hint":
                    rnd += 1
                for it, o, f in zip(items, outs, finish):
                    if it[0] is not p:
                        continue
                    agent = owner[id(it[1])]
                    if kind == "hint":
                        rs = hint_rewards.get(id(o))
                        hint_turn[id(o)] = len(turns)
                        turns.append(_turn(j.episode_id, len(turns), o, f, {
                            "kind": "hint", "agent": agent, "round": rnd, "answer": o.answer,
                            "talk_reward": sum(rs) / len(rs) if rs else None}))
                    else:
                        owner[id(o)] = agent
                        reward, info = rev_reward[id(o)]
                        turns.append(_turn(j.episode_id, len(turns), o, f, {
                            "kind": "revision", "agent": agent, "round": rnd, "answer": o.answer,
                            "talk_reward": reward, "hint_turn": hint_turn[id(info["hint"])],
                            "proposal_correct": info["proposal_correct"], "correct": info["revision_correct"],
                            "kept": bool(kept[(p.problem_id, agent, rnd)])}))
            out = res.results[k]
            ok = bool(out["correct"])
            ep = {"episode_id": j.episode_id, "reward": 1.0 if ok else 0.0, "success": ok, "status": "ok",
                  "stop_reason": "submitted", "num_turns": len(turns), "input_tokens": sum(prompt_lengths(turns)),
                  "output_tokens": sum(len(t["completion_token_ids"]) for t in turns),
                  "final_answer": out["answer"], "answer_parsed": out["answer"] is not None, "error": "", "record": r, "sample_idx": s, "seed": j.seed,
                  "policy_id": policy.policy_id}
            if len(turns) != out["outputs_spent"]:
                raise ValueError(f"talkmesh episode {j.episode_id}: {len(turns)} model-written messages recorded but "
                                 f"the mesh counted {out['outputs_spent']} outputs")
            done[(r["record_id"], s)] = (ep, turns)
    episodes, turns_all = [], []
    for j in jobs:
        ep, ts = done[(j.record["record_id"], j.sample_idx)]
        episodes.append(ep)
        turns_all += ts
    log.info("%s: %s: %d mesh episodes, accuracy %.3f, %.1f messages each", tag, spec.name, len(episodes),
             sum(e["reward"] for e in episodes) / len(episodes), sum(e["num_turns"] for e in episodes) / len(episodes))
    return episodes, turns_all


def talk_train_sequences(episodes: list[dict[str, Any]], turns: list[dict[str, Any]], specs: dict[str, HarnessSpec]
                         ) -> tuple[list[Any], list[dict[str, Any]]]:
    """The talk policy's GRPO batch from talkmesh episodes (rows of the ``episodes`` artifact) and
    their turns: the hint and revision turns rebuilt as :attr:`MeshResult.revisions` entries and
    passed to :func:`tasks.talkmesh.talk.talk_sequences`, one call per harness. Each sequence's
    ``harness_id`` becomes ``<harness_id>|talkmesh-<kind>`` and its ``episode_id`` is prefixed by
    the harness name, so groups (``train.grouping: within``) are (task, harness, kind).

    Returns ``(sequences, talkmesh_talk_sequences rows)``.

    Raises:
        ValueError: a turn of these episodes that is not a TalkMesh message, or a revision whose
            ``hint_turn`` is not a hint turn of its episode.
    """
    from tasks.talkmesh.talk import talk_sequences

    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    seqs: list[Any] = []
    rows: list[dict[str, Any]] = []
    task_hash = {e["task_id"]: e["task_hash"] for e in episodes}
    for hid in sorted({e["harness_id"] for e in episodes}, key=lambda h: (specs[h].name, h)):
        spec = specs[hid]
        assert spec.mesh is not None
        revisions: list[dict[str, Any]] = []
        for e in (e for e in episodes if e["harness_id"] == hid and e["status"] == "ok"):
            ts = sorted(by_ep.get(e["episode_id"], []), key=lambda t: t["turn_idx"])
            outs, acts = [], []
            for t, prompt in iter_prompts(ts):
                if not is_mesh_turn(t["action"]):
                    raise ValueError(f"episode {e['episode_id']} turn {t['turn_idx']}: not a TalkMesh message "
                                     f"(action {str(t['action'])[:60]!r})")
                a = json.loads(t["action"])
                acts.append(a)
                outs.append(Output(t["completion_text"], a.get("answer"), tuple(prompt),
                                   tuple(t["completion_token_ids"]), tuple(t["completion_logprobs"])))
            prob = Problem(e["task_id"], "")
            for a, o in zip(acts, outs):
                if a["kind"] != "revision":
                    continue
                h = a.get("hint_turn")
                if not isinstance(h, int) or not 0 <= h < len(acts) or acts[h]["kind"] != "hint":
                    raise ValueError(f"episode {e['episode_id']}: a revision's hint_turn={h!r} is not a hint turn")
                revisions.append({"problem": prob, "hint": outs[h], "revision": o,
                                  "proposal_correct": bool(a["proposal_correct"]), "revision_correct": bool(a["correct"])})
        s, r = talk_sequences(revisions, spec.mesh.talk_sampling)
        for q in s:
            kind = q.harness_id.rsplit("-", 1)[-1]
            q.harness_id = f"{hid}|talkmesh-{kind}"
            q.episode_id = f"{spec.name}|{q.episode_id}"
            q.task_hash = task_hash[q.task_id]
        seqs += s
        rows += [{**x, "group": f"{spec.name}|{x['group']}"} for x in r]
    return seqs, rows


__all__ = ["is_mesh", "is_mesh_turn", "fit_heads", "heads_from_rows", "run_mesh_records", "talk_train_sequences",
           "HeadScorer", "hidden_states", "mesh_settings"]
