"""The evaluate stage: sealed evaluation of the test split.

Order of operations (the point of sealing):
1. leakage guard: no test-split task hash may appear in the training rollouts or train records;
2. the plan (test records, checkpoints + adapter SHA-256s, harnesses with the held-out ones
   marked, attempts, seeds, pre-registered contrasts, coverage and retry rules) is written and its
   hash committed (``evaluate/plan.json``, ``evaluate/plan.sha256``) before any attempt;
3. every attempt runs, then up to ``infra_retries`` retries of infra_error attempts (new rows
   referring to the original), their turns streamed to ``eval_turns`` shard by shard; rows are
   chained to the plan hash (plan order, retries after) and written; then the statistics
   (``eval_cells``, ``eval_contrasts``) and the exports.
``harnessrl verify RUN_DIR`` recomputes everything (:func:`tasks.evaluate.verify.verify_run`).
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any, Callable

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.evaluate.seal import seal_rows
from tasks.evaluate import witness
from tasks.evaluate.plan import build_plan, evaluate_config_hash
from tasks.evaluate.prereg import PREREG, PREREG_SIG, differences, read_preregistration
from tasks.evaluate.signing import EVALUATE_SEAL, PUBLIC_KEY, commit_plan, load_or_create_key, sign_head
from tasks.hashing import seed_from, sha256_dir
from tasks.rollout.fanout import PolicySource
from tasks.rollout.loop_plugins import plugin_of
from tasks.harnesses.frozen import harness_specs
from tasks.rollout.runner import iter_records
from tasks.records.split_guard import check_leakage

PLAN = EVALUATE_SEAL.plan  # the committed plan's file
log = logging.getLogger("harnessrl.evaluate")


class _Ticker:
    """Adds the seconds since the previous call to ``timings[phase]`` (no-op without a dict)."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings, self.t = timings, time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.t
        self.t = now


def _row(e: dict[str, Any], r: dict[str, Any], ck: dict[str, Any], attempt: int, retry: int, retry_of: str
         ) -> dict[str, Any]:
    status = e["status"] if e["status"] != "ok" else ("resolved" if e["success"] else "unresolved")
    return {
        "eval_id": e["episode_id"], "record_id": r["record_id"], "task_id": r["task_id"],
        "task_hash": r["task_hash"], "checkpoint": ck["name"], "adapter_sha256": ck["adapter_sha256"],
        "harness_id": r["harness_id"], "harness_name": r["harness_name"], "attempt": attempt,
        "seed": e["seed"], "reward": e["reward"], "resolved": status == "resolved", "status": status,
        "num_turns": e["num_turns"], "output_tokens": e["output_tokens"], "final_answer": e.get("final_answer") or "",
        "answer_parsed": bool(e["answer_parsed"]), "retry": retry, "retry_of": retry_of,
    }


def run_evaluate(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef], *,
                 episode_runner: Callable[..., Iterable[tuple[list[dict[str, Any]], list[dict[str, Any]]]]] | None = None,
                 timings: dict[str, float] | None = None) -> dict[str, ArtifactRef]:
    """Guard, plan, seal, run; write ``evaluations``, ``eval_turns`` (the attempts' turns, ``turns``
    contract, episode_id = eval_id), ``eval_cells``, ``eval_contrasts`` and the
    exports (:mod:`tasks.evaluate.exports`).

    The turns are streamed (:meth:`schemas.ArtifactStore.stream`): each chunk of attempts the
    runner yields (one shard) has its turns written before the next chunk is asked for, so the
    stage holds one shard's turns, never all of them; the evaluation rows (one per attempt, no
    tokens) are kept for the seal and the statistics. ``eval_turns`` is in the order the attempts
    ran: checkpoint by checkpoint (plan order), each checkpoint's first attempts in (harness, record,
    attempt) order, then its retries; it is committed after ``evaluations``, once every turn is
    known to belong to a sealed row.

    Args:
        episode_runner: a function with :func:`tasks.rollout.runner.iter_records`'s signature,
            yielding ``(episodes, turns)`` chunks as it does (default: that function). The
            bookkeeping benchmark passes a scripted one. With harnesses of a plugged-in loop type
            it is also given ``loop_states`` (from their ``state_artifact`` inputs).
        timings: if given, filled with the seconds spent in each phase (``guard``, ``plan``,
            ``attempts`` (running them and writing their turns), ``seal``, ``write``, ``stats``,
            ``exports``).

    Raises:
        tasks.records.split_guard.LeakageError: a test-split task is in the training rollouts or train records.
        ValueError: see :func:`tasks.evaluate.plan.build_plan`; a checkpoint's files changed since training; a turn
            whose episode is no sealed attempt.
    """
    from tasks.evaluate.exports import write_exports
    from tasks.evaluate.inspect_log import TURN_COLUMNS
    from tasks.evaluate.stats import cell_table, contrast_table

    runner = episode_runner or iter_records
    tick = _Ticker(timings)
    tasks = store.rows(inputs["tasks"])
    records = store.rows(inputs["records"])
    episodes = store.rows(inputs["episodes"])
    if "online_episodes" in inputs:
        episodes += store.rows(inputs["online_episodes"], contract="episodes")
    check_leakage(tasks, records, episodes)
    checkpoints = store.rows(inputs["checkpoints"])
    tick("guard")
    plan = build_plan(cfg, tasks, records, checkpoints, inputs)
    pre = read_preregistration(store)
    if pre is not None:  # sealed at freeze, before training: the plan may not depart from it
        from tasks.evaluate.signing import check_signature

        check_signature(store, PREREG_SIG, pre[1])
        diff = differences(pre[0], plan)
        if diff:
            raise ValueError(f"evaluate: the plan departs from the pre-registration ({PREREG}, sealed at freeze): "
                             + "; ".join(diff) + ". Changing them means a new run (freeze again)")
        plan["preregistration"] = pre[1]
    else:
        log.warning("evaluate: no %s in this run (frozen without the freeze stage?): nothing to hold the plan to", PREREG)
    signing_key = load_or_create_key()  # outside the run folder ($HARNESSRL_SIGNING_KEY)
    ph, fp = commit_plan(store, EVALUATE_SEAL, plan, signing_key)  # plan, hash, signature: before the first attempt
    log.info("evaluation plan %s signed with Ed25519 key %s (public key: %s)", ph[:16], fp, PUBLIC_KEY)
    witness.record("plan", ph, ph, fp)  # the Prefect server's own record, with its timestamp
    log.info("evaluation plan %s committed: %d records x %d checkpoints x %d attempts, %d contrasts", ph[:16],
             len(plan["records"]), len(plan["checkpoints"]), plan["attempts"], len(plan["contrasts"]))

    tick("plan")
    task_by_id = {t["task_id"]: t for t in tasks}
    rec_by_id = {r["record_id"]: r for r in records}
    specs = harness_specs(store, inputs["harnesses"])
    plan_recs = [rec_by_id[p["record_id"]] for p in plan["records"]]
    loop_kw: dict[str, Any] = {}
    loops = {p.loop_type: p for p in (plugin_of(specs[r["harness_id"]]) for r in plan_recs) if p is not None}
    for plugin in (loops[k] for k in sorted(loops)):
        name = plugin.state_artifact
        if name is None:
            continue
        if name not in inputs:
            raise ValueError(f"evaluate: a {plugin.loop_type} harness is evaluated but the inputs have no {name} (the "
                             "rollout stage's fitted state)")
        loop_kw.setdefault("loop_states", {}).update(plugin.states(store.rows(inputs[name], contract=name)))
    rows: list[dict[str, Any]] = []
    retries: list[dict[str, Any]] = []
    turn_episodes: set[str] = set()
    # eval_id -> the engine's [start, end, batch size] per turn, for the Inspect logs' timing (the
    # runner's episode dicts carry it; no artifact does: it differs between runs)
    turn_times: dict[str, list[list[float]]] = {}
    tool_calls: dict[str, list[list[dict[str, Any]]]] = {}  # eval_id -> per turn its tool calls' times
    ch = evaluate_config_hash(cfg)
    with store.stream("evaluate", "eval_turns", contract="turns") as turns_out, \
            tempfile.TemporaryDirectory(prefix="harnessrl-eval-") as tmp:

        def attempts(*args: Any) -> Iterator[dict[str, Any]]:
            """The episodes of one runner call, chunk by chunk, their turns written on the way."""
            for eps, chunk_turns in runner(*args, **loop_kw):
                turns_out.add(chunk_turns)
                turn_episodes.update(t["episode_id"] for t in chunk_turns)
                for e in eps:
                    if e.get("turn_times"):
                        turn_times[e["episode_id"]] = e["turn_times"]
                    if any(e.get("tool_calls") or []):
                        tool_calls[e["episode_id"]] = e["tool_calls"]
                yield from eps

        for ck in plan["checkpoints"]:
            adapter = None
            if ck["path"]:
                adapter = store.get_dir(ck["path"], Path(tmp) / ck["name"])
                if sha256_dir(adapter) != ck["adapter_sha256"]:
                    raise ValueError(f"checkpoint {ck['name']}: files changed since training")
            policy = PolicySource.of(cfg, adapter)  # loaded once per process by whichever runner runs it
            ck_rows = [_row(e, e["record"], ck, e["sample_idx"], 0, "")
                       for e in attempts(policy, cfg, specs, task_by_id, plan_recs, plan["attempts"],
                                         seed_from(plan["seed"], ck["name"]), f"eval:{ck['name']}")]
            rows += ck_rows
            pending = [r for r in ck_rows if r["status"] == "infra_error"]
            for n in range(1, plan["infra_retries"] + 1):
                if not pending:
                    break
                again = []
                for a in sorted({r["attempt"] for r in pending}):
                    orig = {r["record_id"]: r for r in pending if r["attempt"] == a}
                    recs = [rec_by_id[i] for i in sorted(orig)]
                    again += [_row(e, e["record"], ck, a, n, orig[e["record"]["record_id"]]["eval_id"])
                              for e in attempts(policy, cfg, specs, task_by_id, recs, 1,
                                                seed_from(plan["seed"], ck["name"], "retry", n, a),
                                                f"eval:{ck['name']}:retry{n}:attempt{a}")]
                log.info("%s: retry %d of %d infra_error attempt(s): %d still infra_error", ck["name"], n, len(pending),
                         sum(r["status"] == "infra_error" for r in again))
                retries += again
                pending = [r for r in again if r["status"] == "infra_error"]
        tick("attempts")
        order = {(p["record_id"]): i for i, p in enumerate(plan["records"])}
        ck_order = {c["name"]: i for i, c in enumerate(plan["checkpoints"])}
        key = lambda r: (r["retry"], ck_order[r["checkpoint"]], order[r["record_id"]], r["attempt"])  # noqa: E731
        rows.sort(key=key)
        retries.sort(key=key)
        sealed = seal_rows(rows + retries, ph)
        tick("seal")
        stray = turn_episodes - {r["eval_id"] for r in sealed}
        if stray:
            raise ValueError(f"evaluate: turns of {len(stray)} episode(s) that are no sealed attempt, e.g. "
                             f"{sorted(stray)[0]}")
        ref = store.write("evaluate", "evaluations", sealed, inputs=list(inputs.values()), config_hash=ch,
                          extra={"plan_hash": ph})
        head = sealed[-1]["seal_hash"] if sealed else ph
        sign_head(store, EVALUATE_SEAL, head, signing_key)  # after the last attempt
        log.info("evaluation chain head %s signed with %s", head[:16], fp)
        witness.record("head", ph, head, fp)
        # every turn of every attempt (episode_id = eval_id): what the analyses read (action
        # distributions, visited states); the sealed rows stay the record of results
        turns_ref = turns_out.commit(inputs=[ref], config_hash=ch, extra={"plan_hash": ph})
    tick("write")
    cells = cell_table(sealed, plan, plan["min_graded_fraction"])
    contrasts = contrast_table(sealed, plan, cells, alpha=plan["alpha"], resamples=plan["bootstrap_resamples"],
                               power=plan["power"])
    cells_ref = store.write("evaluate", "eval_cells", cells, inputs=[ref], config_hash=ch, extra={"plan_hash": ph})
    con_ref = store.write("evaluate", "eval_contrasts", contrasts, inputs=[ref], config_hash=ch,
                          extra={"plan_hash": ph})
    found: dict[str, Any] = {}
    if plan.get("findings"):
        from tasks.evaluate.findings import finding_table

        findings = finding_table(sealed, plan, contrasts)
        found["eval_findings"] = store.write("evaluate", "eval_findings", findings, inputs=[ref], config_hash=ch,
                                             extra={"plan_hash": ph})
        for f in findings:
            log.info("finding %s (%s): %s [%s, %s] -> %s (%s)", f["name"], f["paper"],
                     *("n/a" if v is None else f"{v:+.3f}" for v in (f["estimate"], f["ci_low"], f["ci_high"])),
                     f["verdict"], f["reason"])
    tick("stats")
    for c in cells:
        if c["kind"] == "cell":
            log.info("%s / %s%s: graded %d/%d, infra %d, pass@1 %s", c["checkpoint"], c["harness_name"],
                     " (held out)" if c["held_out"] else "", c["graded"], c["planned"], c["infra_errors"],
                     "n/a" if c["pass_at_1"] is None else f"{c['pass_at_1']:.3f}")
    # the Inspect logs read each (checkpoint, harness)'s turns back from the committed artifact
    # an Inspect log needs each turn's text only: the token-id columns are never decoded
    turns_of = functools.partial(store.rows_where, turns_ref, "episode_id", columns=list(TURN_COLUMNS))
    write_exports(store, cfg.name, plan, ph, sealed, cells, turns_of, task_by_id,
                  {s.name: s.render_system() for s in specs.values()}, turn_times=turn_times, tool_calls=tool_calls)
    tick("exports")
    return {"evaluations": ref, "eval_cells": cells_ref, "eval_contrasts": con_ref, "eval_turns": turns_ref,
            **found}
