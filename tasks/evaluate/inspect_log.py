"""Inspect AI eval logs of a sealed evaluation, written with inspect-ai's own types.

One log per (checkpoint, evaluation harness) of the plan, ``evaluate/inspect/<checkpoint>.<harness>.eval`` (Inspect's native ``.eval`` format, :func:`inspect_ai.log.write_eval_log`), so
``inspect view --log-dir RUN/evaluate/inspect`` and :func:`inspect_ai.log.read_eval_log` open a
sealed run without harnessrl's code:

- ``eval`` (:class:`~inspect_ai.log.EvalSpec`): task ``<run>/<harness>``, ``task_id``
  ``<run>.<harness>.<checkpoint>`` (Inspect View takes logs sharing a task_id for retries of one
  another and lists only the newest), model ``harnessrl/<policy model>@<checkpoint>`` (a model
  folder path by its last part), ``run_id`` = the plan hash, dataset = the plan's
  records under the harness, ``config.epochs`` = the plan's attempts, package versions and the git
  revision; ``viewer.trust_content`` False, so Inspect View shows every text as plain text, as
  the model read it (a code fence in a prompt is not rendered away); ``metadata`` holds the seal:
  ``plan_hash``, ``chain_head`` (the last sealed row's ``seal_hash``), the checkpoint's
  ``adapter_sha256``, the harness's ``harness_id`` and whether it is held out.
- one :class:`~inspect_ai.log.EvalSample` per planned attempt, by its final outcome
  (:func:`tasks.evaluate.stats.final_attempts`): ``id`` = task_id, ``epoch`` = attempt + 1,
  ``target`` = the task's reference answer, or the tests its verifier runs (:func:`target_of`;
  the logs are written after the seal, from the frozen tasks), ``messages`` = the harness's system
  prompt, the task instruction, then each turn's completion and the observation the engine sent
  back (a user message, as the model read it); ``events`` = per turn one ``ModelEvent`` (its input
  messages, its completion, prompt and completion token counts from the turn rows, and its
  timing: ``timestamp``/``completed`` span the engine call that sampled the turn, shared by the
  ``metadata.batch_requests`` episodes of its batch (``metadata.batch_wall_s`` its seconds);
  ``working_time`` and ``output.time`` are this request's share, wall / requests), then one
  ``ToolEvent`` per tool call that ran (function, arguments, the text the model was shown as the
  result, an error naming the exec status and exit code when not ``ok``, its own start, end and
  seconds; :func:`_tool_events`); the sample's ``working_time`` and ``total_time`` (Inspect View's
  Duration column) are its own share, the sum of its model shares and tool seconds, and
  ``started_at``/``completed_at`` the window from its first call's start to its last call's end
  (the episodes of a batch advance in lock-step, so a batch's samples share one window);
  ``output`` = the
  final answer; ``scores`` ``resolved`` ("C"/"I", Inspect's correct/incorrect) and ``reward``,
  each with an explanation (:func:`explanation`), for a graded attempt (a timeout is a graded
  failure), none and ``error`` set for a final ``infra_error``; ``metadata`` = the sealed row's
  ``eval_id``, ``seq``, ``seal_hash``, ``prev_hash``, ``status``, ``retry`` (and the eval_ids it
  replaced), ``seed``, ``num_turns``, ``output_tokens`` and, for a timed attempt, ``timing``
  (:data:`TIMING_NOTE`: what the times are).
- ``results``: the cell's pass@1 and pass@K from ``eval_cells`` as the ``resolved`` scorer's metrics
  (none when the cell does not count), and ``accuracy`` = resolved / graded samples; the ``reward``
  score's ``mean`` (and ``stderr``) over the graded samples.

Timing comes from the runner's episodes (``turn_times`` and ``tool_calls``,
:func:`tasks.rollout.harness.run_episodes`), which no artifact holds: it differs between runs. An
attempt without it (a runner that records none, e.g. a scripted one or a loop plugin) has its
events stamped with the time of writing and no durations. ``eval.created`` is the time of writing; ``stats`` span the log's timed turns.
So the logs are the one evaluate output that is not byte-identical across re-runs; every sealed
value in them is (:func:`tasks.evaluate.exports.check_inspect_logs` compares them with the rows).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

from schemas import ArtifactStore
from schemas.store import code_version, package_versions
from tasks.evaluate.stats import GRADED, final_attempts

# the attempts' turn rows, or a function from a set of eval_ids to those episodes' turn rows
TurnSource = Union[list[dict[str, Any]], Callable[[set[str]], list[dict[str, Any]]]]

INSPECT_DIR = "evaluate/inspect"
# the turns columns a log is built from (``_messages``)
TURN_COLUMNS = ("episode_id", "turn_idx", "completion_text", "observation", "prompt_continues", "prompt_added_ids",
                "completion_token_ids", "finish_reason", "action")
SCORER = "harnessrl_verifier"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def log_path(checkpoint: str, harness: str) -> str:
    """The run-relative path of the Inspect log of (checkpoint, harness)."""
    return f"{INSPECT_DIR}/{_safe(f'{checkpoint}.{harness}')}.eval"


def _messages(eval_id: str, system: str, instruction: str, turns: list[dict[str, Any]]) -> list[Any]:
    """The attempt as chat messages; ids ``<eval_id>-m<i>`` (Inspect would draw random ones; given
    to the constructor, no random one is drawn first)."""
    return _transcript(eval_id, system, instruction, turns, "")[0]


def _prompt_tokens(turns: list[dict[str, Any]]) -> list[int]:
    """Each turn's prompt length in tokens, rebuilt from the stored turns as
    :func:`tasks.rollout.turns.episode_prompts` does (a turn that continues adds its tokens to the
    previous prompt + completion; one that does not stores its whole prompt)."""
    out: list[int] = []
    for i, t in enumerate(turns):
        added = len(t.get("prompt_added_ids") or [])
        if t.get("prompt_continues") and i > 0:
            out.append(out[-1] + len(turns[i - 1].get("completion_token_ids") or []) + added)
        else:
            out.append(added)
    return out


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


# a tool call's exec status -> the type of Inspect's ToolCallError
_ERROR_TYPES = {"timeout": "timeout", "output_limit": "limit", "cpu_limit": "limit", "disk_limit": "limit",
                "memory_limit": "limit"}
# what the sample's working time and each model event's time are, in each sample's metadata
TIMING_NOTE = ("model calls: each event spans the engine call that sampled the turn (timestamp to completed), "
               "shared by metadata.batch_requests requests; its time and working_time are this request's share, "
               "metadata.batch_wall_s / batch_requests. Tool calls: their own wall time. The sample's working and "
               "total time: the sum of both, its own share; its window: first call's start to last call's end, "
               "shared with the episodes batched with it")


def _transcript(eval_id: str, system: str, instruction: str, turns: list[dict[str, Any]], model: str,
                when: str = "", times: list[list[float]] | None = None,
                tools: list[list[dict[str, Any]]] | None = None) -> tuple[list[Any], list[Any]]:
    """The attempt's chat messages (as the model read them: the observations as the user turns
    they were) and its events: per turn one Inspect ``ModelEvent`` (its input messages, its
    completion with the prompt and completion token counts, its stop reason), then one
    ``ToolEvent`` per tool call that ran (:func:`_tool_events`). ``times``: per turn index
    ``[start, end, batch requests]`` of the engine call (Unix seconds): the event spans the call;
    its ``working_time`` and ``output.time`` are the request's share, ``(end - start) / batch
    requests``, with ``metadata.batch_wall_s`` and ``metadata.batch_requests`` beside. ``tools``:
    per turn index the runner's tool-call records (``tasks.rollout.harness._Episode.tool_calls``).
    An event without a time is stamped ``when`` (the time of writing) with no duration."""
    from inspect_ai.event import ModelEvent
    from inspect_ai.model import (ChatMessageAssistant, ChatMessageSystem, ChatMessageUser, GenerateConfig,
                                  ModelOutput, ModelUsage)

    def mid() -> str:
        return f"{eval_id[:16]}-m{len(out)}"

    out: list[Any] = []
    events: list[Any] = []
    out.append(ChatMessageSystem(content=system, id=mid()))
    out.append(ChatMessageUser(content=instruction, id=mid()))
    turns = sorted(turns, key=lambda t: t["turn_idx"])
    t_first = times[0][0] if times else None
    for t, n_in in zip(turns, _prompt_tokens(turns)):
        before = list(out)
        reply = ChatMessageAssistant(content=t["completion_text"] or "", model=None, id=mid())
        out.append(reply)
        if model:
            n_out = len(t.get("completion_token_ids") or [])
            output = ModelOutput.from_message(reply, stop_reason="max_tokens" if t.get("finish_reason") == "length"
                                              else "stop")
            output.model = model
            output.usage = ModelUsage(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)
            tt = times[t["turn_idx"]] if times and t["turn_idx"] < len(times) else None
            if tt is not None and t_first is not None:
                wall, n = tt[1] - tt[0], max(1, int(tt[2]))
                output.time = wall / n
                timing: dict[str, Any] = dict(timestamp=_utc(tt[0]), completed=_utc(tt[1]),
                                              working_start=tt[0] - t_first, working_time=wall / n,
                                              metadata={"batch_requests": n, "batch_wall_s": wall})
            else:
                timing = dict(working_start=0.0, **({"timestamp": when} if when else {}))
            events.append(ModelEvent(model=model, input=before, tools=[], tool_choice="none", config=GenerateConfig(),
                                     output=output, uuid=f"{eval_id[:16]}-e{len(events)}", **timing))
            calls = tools[t["turn_idx"]] if tools and t["turn_idx"] < len(tools) else None
            events += _tool_events(f"{eval_id[:16]}-t{t['turn_idx']}", t, calls, t_first, when)
        if t.get("observation"):
            out.append(ChatMessageUser(content=t["observation"], id=mid()))
    return out, events


def _tool_events(prefix: str, turn: dict[str, Any], timed: list[dict[str, Any]] | None, t_first: float | None,
                 when: str) -> list[Any]:
    """One Inspect ``ToolEvent`` per tool call of the turn that ran: the calls of its ``action``
    JSON (``calls``: tool, impl, args) up to the number of exec statuses (``tool_status``; the
    calls after a submit never ran). ``function`` = the harness's tool name, ``arguments`` = the
    parsed arguments, ``result`` = the call's text as the observation showed it to the model (or,
    when no observation did, the episode having ended, the text the runner kept), ``error`` = a
    ``ToolCallError`` for a status other than ``ok``: ``<status> (exit code <n>)``, a line break
    and the result (Inspect View shows a failed call's error instead of its result), ``metadata``
    = ``status``, ``exit_code``, ``impl``. ``timed``: the runner's records of the calls (start,
    end, exit code, where the observation shows each); without them the events carry no time, no
    exit code, and the result is the whole observation when one call ran (else empty)."""
    import json

    from inspect_ai.event import ToolEvent
    from inspect_ai.tool import ToolCallError

    action = json.loads(turn.get("action") or "{}")
    status = action.get("tool_status") or []
    calls = (action.get("calls") or [])[:len(status)]
    observation = turn.get("observation") or ""
    events = []
    for i, (call, st) in enumerate(zip(calls, status)):
        rec = timed[i] if timed and i < len(timed) else {}
        if rec.get("shown"):
            result = observation[rec["shown"][0]:rec["shown"][0] + rec["shown"][1]]
        elif "output" in rec:
            result = rec["output"]
        else:
            result = observation if len(calls) == 1 else ""
        code = rec.get("exit_code")
        # Inspect View shows a failed call's error in place of its result: the error holds both
        head = f"{st}" + ("" if code is None else f" (exit code {code})")
        error = None if st == "ok" else ToolCallError(_ERROR_TYPES.get(st, "unknown"),
                                                      f"{head}\n{result}" if result else head)
        timing: dict[str, Any] = (dict(timestamp=_utc(rec["start"]), completed=_utc(rec["end"]),
                                       working_start=rec["start"] - t_first, working_time=rec["end"] - rec["start"])
                                  if "start" in rec and t_first is not None
                                  else dict(working_start=0.0, **({"timestamp": when} if when else {})))
        events.append(ToolEvent(id=f"{prefix}-c{i}", function=call["tool"], arguments=call.get("args") or {},
                                result=result, error=error, uuid=f"{prefix}-c{i}",
                                metadata={"status": st, "exit_code": code, "impl": call.get("impl")}, **timing))
    return events


def target_of(task: dict[str, Any]) -> str:
    """What a sample is graded against, for a reader: the reference answer of an answer task, else
    the tests its verifier runs (``test``/``tests`` of the verifier spec), else the spec itself."""
    import json

    spec = task.get("verifier_spec") or "{}"
    spec = json.loads(spec) if isinstance(spec, str) else spec
    if "answer" in spec:
        return str(spec["answer"])
    for key in ("test", "tests"):
        if spec.get(key):
            return str(spec[key])
    return json.dumps({k: v for k, v in spec.items() if not k.endswith("_b64")}, sort_keys=True)[:4000]


def explanation(row: dict[str, Any], task: dict[str, Any]) -> str:
    """Why the sealed attempt scored what it did: the parsed final answer against the expected one
    (answer tasks), or the verifier's verdict on the tests (workspace tasks)."""
    verdict = "correct" if row["resolved"] else ("timed out" if row["status"] == "timeout" else "incorrect")
    answer = row["final_answer"] or ""
    if task.get("environment") == "answer":
        return (f"{verdict}: parsed answer {answer!r} vs expected {target_of(task)!r} "
                f"(reward {float(row['reward']):g}, {row['num_turns']} turn(s))")
    return (f"{verdict}: the {task.get('verifier_kind', 'verifier')} tests gave reward {float(row['reward']):g} "
            f"for the submitted files ({row['num_turns']} turn(s), status {row['status']})")


def _output(model: str, row: dict[str, Any]) -> Any:
    from inspect_ai.model import ModelOutput

    out = ModelOutput.from_content(model, row["final_answer"] or "")
    out.choices[0].message.id = f"{row['eval_id'][:16]}-out"
    return out


@dataclass(frozen=True)
class _Shared:
    """What every Inspect log of a run is built from besides its own turns (picklable: each export
    worker process gets it once)."""

    run_name: str
    plan: dict[str, Any]
    p_hash: str
    head: str
    n_rows: int
    finals: dict[tuple, dict[str, Any]]
    replaced: dict[str, list[str]]
    cell: dict[tuple[str, str], dict[str, Any]]
    held: set[str]
    revision: dict[str, Any] | None  # EvalRevision's fields (the pool's parent never imports inspect-ai)
    packages: dict[str, str]
    now: str
    tasks: dict[str, dict[str, Any]]
    systems: dict[str, str]
    times: dict[str, list[list[float]]]  # eval_id -> per turn [start, end, batch requests]
    tools: dict[str, list[list[dict[str, Any]]]]  # eval_id -> per turn the runner's tool-call records

    def keys(self, checkpoint: str, harness: str) -> list[tuple]:
        """The final attempts of (checkpoint, harness), by task then attempt."""
        return sorted((k for k in self.finals if k[0] == checkpoint and k[1] == harness),
                      key=lambda k: (self.finals[k]["task_id"], k[3]))


def _shared(run_name: str, plan: dict[str, Any], p_hash: str, rows: list[dict[str, Any]],
            cells: list[dict[str, Any]], tasks: dict[str, dict[str, Any]], systems: dict[str, str],
            times: dict[str, list[list[float]]] | None = None,
            tools: dict[str, list[list[dict[str, Any]]]] | None = None) -> _Shared:
    replaced: dict[str, list[str]] = {}
    for r in rows:
        if r["retry"]:
            replaced.setdefault(r["eval_id"], []).append(r["retry_of"])
    rev = code_version()
    return _Shared(
        run_name=run_name, plan=plan, p_hash=p_hash, head=rows[-1]["seal_hash"] if rows else p_hash, n_rows=len(rows),
        finals=final_attempts(rows), replaced=replaced,
        cell={(c["checkpoint"], c["harness_name"]): c for c in cells if c["kind"] == "cell"},
        held=set(plan.get("held_out", [])),
        revision=dict(type="git", origin="", commit=rev["git_sha"], dirty=rev["dirty"]) if rev["git_sha"] else None,
        packages={k: v for k, v in package_versions().items() if v}, now=datetime.now(timezone.utc).isoformat(),
        tasks=tasks, systems=systems, times=times or {}, tools=tools or {})


def _turns_of(turns: TurnSource) -> Callable[[set[str]], list[dict[str, Any]]]:
    return turns if callable(turns) else (lambda ids, _all=turns: [t for t in _all if t["episode_id"] in ids])


def _build(sh: _Shared, ck: dict[str, Any], h: str, turn_rows: list[dict[str, Any]]) -> Any:
    """The ``EvalLog`` of (checkpoint ``ck``, harness ``h``) from its final attempts' turn rows."""
    from inspect_ai.log import (EvalConfig, EvalDataset, EvalError, EvalLog, EvalMetric, EvalResults, EvalRevision,
                                EvalSample, EvalScore, EvalSpec, EvalStats)
    from inspect_ai.scorer import Score
    from inspect_ai.viewer import ViewerConfig

    plan, p_hash, run_name, finals, now = sh.plan, sh.p_hash, sh.run_name, sh.finals, sh.now
    tasks, systems, replaced, held = sh.tasks, sh.systems, sh.replaced, sh.held
    recs = [p for p in plan["records"] if p["harness_name"] == h]
    model = model_name(plan["policy"]["model"], ck["name"])
    samples = []
    keys = sh.keys(ck["name"], h)
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in turn_rows:
        by_ep.setdefault(t["episode_id"], []).append(t)
    for key in keys:
        r = finals[key]
        graded = r["status"] in GRADED
        task = tasks[r["task_id"]]
        times = sh.times.get(r["eval_id"])
        messages, events = _transcript(r["eval_id"], systems[h], task["instruction"], by_ep.get(r["eval_id"], []),
                                       model, now, times, sh.tools.get(r["eval_id"]))
        usage = _usage(events)
        ends = [e.completed.timestamp() for e in events if e.completed is not None]
        span = (times[0][0], max(ends)) if times and ends else None
        own = sum(e.working_time or 0.0 for e in events)  # this attempt's share of the batches, its tools' time
        samples.append(EvalSample(
            id=r["task_id"], epoch=r["attempt"] + 1, input=task["instruction"], target=target_of(task),
            messages=messages, events=events, model_usage={model: usage} if usage else {},
            output=_output(model, r),
            **(dict(started_at=_utc(span[0]).isoformat(), completed_at=_utc(span[1]).isoformat(),
                    total_time=own, working_time=own)
               if span else {}),
            scores={"resolved": Score(value="C" if r["resolved"] else "I", answer=r["final_answer"] or "",
                                      explanation=explanation(r, task), metadata={"status": r["status"]}),
                    "reward": Score(value=float(r["reward"]), answer=r["final_answer"] or "",
                                    explanation=explanation(r, task))} if graded else None,
            error=None if graded else EvalError(message=f"infrastructure error (sealed row {r['seq']}, not "
                                                        "graded: left out of every denominator)",
                                                traceback="", traceback_ansi=""),
            metadata={"eval_id": r["eval_id"], "record_id": r["record_id"], "seq": r["seq"],
                      "seal_hash": r["seal_hash"], "prev_hash": r["prev_hash"], "status": r["status"],
                      "retry": r["retry"], "replaces": replaced.get(r["eval_id"], []), "seed": r["seed"],
                      "num_turns": r["num_turns"], "output_tokens": r["output_tokens"],
                      **({"timing": TIMING_NOTE} if span else {})},
        ))
    c = sh.cell.get((ck["name"], h), {})
    n_graded = sum(1 for s in samples if s.scores)
    metrics = {"accuracy": EvalMetric(name="accuracy", value=(
        sum(1 for s in samples if s.scores and s.scores["resolved"].value == "C") / n_graded) if n_graded else 0.0)}
    for name in ("pass_at_1", "pass_at_k"):
        if c.get(name) is not None:
            metrics[name] = EvalMetric(name=name, value=float(c[name]))
    rewards = [float(s.scores["reward"].value) for s in samples if s.scores]
    reward_metrics = {"mean": EvalMetric(name="mean", value=sum(rewards) / len(rewards) if rewards else 0.0)}
    if len(rewards) > 1:
        m = reward_metrics["mean"].value
        var = sum((x - m) ** 2 for x in rewards) / (len(rewards) - 1)
        reward_metrics["stderr"] = EvalMetric(name="stderr", value=(var / len(rewards)) ** 0.5)
    total = _usage([e for smp in samples for e in (smp.events or [])])
    log = EvalLog(
        version=2, status="success",
        eval=EvalSpec(
            eval_id=p_hash[:16] + "-" + _safe(f"{ck['name']}.{h}"), run_id=p_hash, created=now,
            # one task_id per (checkpoint, harness): Inspect View takes logs sharing a task_id for
            # retries of one another and lists only the newest
            task=f"{run_name}/{h}", task_id=_safe(f"{run_name}.{h}.{ck['name']}"),
            dataset=EvalDataset(name=run_name, samples=len(recs), sample_ids=sorted(p["task_id"] for p in recs)),
            model=model, config=EvalConfig(epochs=int(plan["attempts"])), packages=sh.packages,
            # plain text: Inspect View shows every message as the model read it (a code fence in a
            # prompt stays a fence, not a rendered code block)
            viewer=ViewerConfig(trust_content=False),
            revision=EvalRevision(**sh.revision) if sh.revision else None,
            metadata={"plan_hash": p_hash, "chain_head": sh.head, "checkpoint": ck["name"],
                      "adapter_sha256": ck["adapter_sha256"], "harness_name": h,
                      "harness_id": recs[0]["harness_id"] if recs else "", "held_out": h in held,
                      "sealed_rows": sh.n_rows},
        ),
        results=EvalResults(total_samples=len(samples), completed_samples=n_graded, scores=[
            EvalScore(name="resolved", scorer=SCORER, scored_samples=n_graded,
                      unscored_samples=len(samples) - n_graded, metrics=metrics,
                      metadata={"counted": bool(c.get("counted")), "graded_fraction": c.get("graded_fraction"),
                                "k": c.get("k")}),
            EvalScore(name="reward", scorer=SCORER, scored_samples=n_graded,
                      unscored_samples=len(samples) - n_graded, metrics=reward_metrics)]),
        stats=EvalStats(started_at=min((s.started_at for s in samples if s.started_at), default=now),
                        completed_at=max((s.completed_at for s in samples if s.completed_at), default=now),
                        model_usage={model: total} if total else {}),
        samples=samples,
    )
    return log


def model_name(model: str, checkpoint: str) -> str:
    """The Inspect model name ``harnessrl/<model>@<checkpoint>``; a model given as a folder path
    is named by its last part (a path would give ``harnessrl//abs/path``)."""
    name = model.rstrip("/").rsplit("/", 1)[-1] if "/" in model else model
    return f"harnessrl/{_safe(name)}@{checkpoint}"


def _usage(events: list[Any]) -> Any:
    """The summed ``ModelUsage`` of ``events`` (None without any)."""
    from inspect_ai.model import ModelUsage

    usages = [e.output.usage for e in events if getattr(e, "output", None) is not None and e.output.usage]
    if not usages:
        return None
    total = ModelUsage()
    for u in usages:
        total = total + u
    return total


# at least this many samples before the logs are written by a pool of processes: a worker's start
# (importing inspect-ai, about 2 s) costs about what writing 1,000 samples does
PARALLEL_MIN_SAMPLES = 2000


def write_inspect_logs(store: ArtifactStore, run_name: str, plan: dict[str, Any], p_hash: str,
                       rows: list[dict[str, Any]], cells: list[dict[str, Any]], turns: TurnSource,
                       tasks: dict[str, dict[str, Any]], systems: dict[str, str], workers: int | None = None,
                       turn_times: dict[str, list[list[float]]] | None = None,
                       tool_calls: dict[str, list[list[dict[str, Any]]]] | None = None) -> list[str]:
    """Build the Inspect logs of a sealed evaluation (see the module docstring), one per
    (checkpoint, harness) in plan order, holding one log's turns at a time; write each with
    :func:`inspect_ai.log.write_eval_log` to a local temporary file, then atomically into the run
    folder (:meth:`schemas.ArtifactStore.write_bytes`). Returns the paths.

    Args:
        rows: the sealed ``evaluations`` rows (chain order).
        cells: the ``eval_cells`` rows (for the cell metrics).
        turns: the attempts' ``turns`` rows (episode_id = eval_id), or a function from a set of
            eval_ids to those episodes' turn rows (e.g. read from the committed ``eval_turns``).
        tasks: task_id -> ``tasks`` row (``instruction``).
        systems: harness name -> the rendered system prompt of that harness.
        turn_times: eval_id -> per turn ``[start, end, batch requests]`` of the engine call that
            sampled it (the runner's episode ``turn_times``); attempts missing from it get no timing.
        tool_calls: eval_id -> per turn the tool calls that ran (the runner's episode
            ``tool_calls``: start, end, exit code, where the observation shows each); attempts
            missing from it get tool events without times or exit codes.

    ``workers``: processes that build and write the logs (``concurrent.futures``, spawn; each gets
    the shared inputs once and one log's turn rows at a time, read here, with at most ``workers + 1``
    logs in flight). None: one per CPU when there are at least :data:`PARALLEL_MIN_SAMPLES`
    samples and more than one log, else this process. Building and compressing a log is
    CPU-bound Python (pydantic, zstd), so the pool divides the time by up to the CPUs.
    """
    import os
    from concurrent.futures import ProcessPoolExecutor

    sh = _shared(run_name, plan, p_hash, rows, cells, tasks, systems, turn_times, tool_calls)
    jobs = [(ck, h) for ck in plan["checkpoints"] for h in plan["harnesses"]]
    if workers is None:  # the CPUs this process may run on (a container's share, not the host's count)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = min(cpus, len(jobs)) if len(sh.finals) >= PARALLEL_MIN_SAMPLES else 1
    turns_of = _turns_of(turns)

    def turn_rows(job: tuple[dict[str, Any], str]) -> list[dict[str, Any]]:
        return turns_of({sh.finals[k]["eval_id"] for k in sh.keys(job[0]["name"], job[1])})

    written = []
    with tempfile.TemporaryDirectory(prefix="harnessrl-inspect-") as tmp:
        def commit(job: tuple[dict[str, Any], str], local: str) -> None:
            rel = log_path(job[0]["name"], job[1])
            store.write_bytes(rel, Path(local).read_bytes())
            Path(local).unlink()
            written.append(rel)

        if workers <= 1:
            for job in jobs:
                commit(job, _write_log(sh, job[0], job[1], turn_rows(job), tmp))
            return written
        import multiprocessing

        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(sh,)) as pool:
            pending = []
            try:
                for job in jobs:
                    pending.append((job, pool.submit(_write_in_worker, job[0], job[1], turn_rows(job), tmp)))
                    if len(pending) > workers:  # in plan order; a worker finds the next log's turns read
                        done, fut = pending.pop(0)
                        commit(done, fut.result())
                for done, fut in pending:
                    commit(done, fut.result())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # the queued logs are not started
                raise
    return written


def _write_log(sh: _Shared, ck: dict[str, Any], h: str, turn_rows: list[dict[str, Any]], tmp: str) -> str:
    """Build the log of (``ck``, ``h``) and write it under ``tmp``; returns the file's path."""
    from inspect_ai.log import write_eval_log

    local = str(Path(tmp) / Path(log_path(ck["name"], h)).name)
    write_eval_log(_build(sh, ck, h, turn_rows), local, format="eval")
    return local


_WORKER_SHARED: _Shared | None = None


def _init_worker(sh: _Shared) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = sh


def _write_in_worker(ck: dict[str, Any], h: str, turn_rows: list[dict[str, Any]], tmp: str) -> str:
    assert _WORKER_SHARED is not None, "export worker used before its initializer ran"
    return _write_log(_WORKER_SHARED, ck, h, turn_rows, tmp)
