"""The harness engine: one interpreter for every harness spec.

Per episode: set up the task's environment (the sandbox work dir from the task's visible
workspace, or the browser page) -> render the prompt -> the policy generates -> parse the reply
under the spec's action format -> run the tool calls in the episode's sandbox or browser ->
observation -> repeat under the spec's loop type until the stop condition, ``max_turns``, the
context budget or the wall-clock limit -> the verifier grades (only now does the task's hidden
verifier spec come into play: hidden tests are copied into the sandbox by the verifier).

Episodes of one harness advance in lock-step: one batched ``generate`` call per turn for every
episode still running; their tool calls then run concurrently (each in its own sandbox).

Token accounting: each turn's prompt is the previous turn's prompt + completion + the observation
ids, never re-tokenised; an episode whose prompt would not extend its previous one exactly raises
(it would be unusable for training). A turn row stores only what its prompt adds (the first turn:
the whole prompt; later turns: the observation and chat-format tokens), so an episode's storage
grows linearly with its context; :func:`tasks.rollout.turns.episode_prompts` rebuilds the prompts. Observation tokens are outside every completion, so the
trainer's loss mask gives them 0. ``read_spans`` record which system, skill, demonstration, instruction, file,
page or tool-output text entered the context at which turn and at which token positions.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from schemas.faults import fault_point
from tasks.config import SandboxConfig
from tasks.harnesses.actions import ParsedReply, fallback_answer, last_code_block, parse_reply
from tasks.harnesses.spec import ENGINE_LOOP_TYPES, HarnessSpec, SamplingSpec, render
from tasks.environments.errors import BrowserError, SandboxError, SandboxPathError
from tasks.environments.sandbox import Sandbox, make_sandbox
from tasks.harnesses.tools import IMPLS, ToolOutput
from tasks.hashing import canonical_json, seed_from, sha256_text
from tasks.progress import on_requests_done
from tasks.records.verifiers import VerifierError, grade
from tasks.rollout.generation import ChatFormat, Generation
from tasks.rollout.turns import first_turn, next_turn

log = logging.getLogger("harnessrl.harness")

# Why an episode ended (the ``episodes.stop_reason`` column), in order of precedence when several
# hold on the last turn: the environment failed; the episode's wall-clock limit; the context budget
# or the last reply cut at ``max_new_tokens`` (that turn's ``finish_reason`` is ``length``); an
# answer-environment episode that ended with nothing to grade; out of turns; the agent ended it.
STOP_REASONS = ("infra_error", "timeout", "max_tokens", "format_error", "max_turns", "submitted")


class Policy(Protocol):
    tokenizer: Any

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Generation]: ...


def takes_states(policy: Any) -> bool:
    """Whether ``policy.generate`` takes ``states`` and ``keep_states`` (the ``hf`` engine: an
    episode's next turn starts from the keys and values of its previous one,
    :mod:`tasks.rollout.engines.hf_prefix`). A wrapper says so with a ``takes_states`` attribute;
    otherwise the signature decides."""
    import inspect

    flag = getattr(type(policy), "takes_states", None)
    if flag is not None:
        return bool(getattr(policy, "takes_states"))
    try:
        params = inspect.signature(policy.generate).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "states" in params and "keep_states" in params


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: the record (task x harness), the task row, and its sample index."""

    episode_id: str
    record: dict[str, Any]
    task: dict[str, Any]
    sample_idx: int
    seed: int
    noise_seed: int | None = None  # common random numbers: set when the record has a noise_key


class EpisodeEnv:
    """What one episode acts on, created on first use and closed once graded: the sandbox (its
    work dir set up from the task's visible ``workspace``) and, for browser tasks, the browser
    session. Implements the tools' ``ToolEnv`` and the verifiers' ``GradeContext``.

    Raises (from :meth:`sandbox`): SandboxError when the sandbox cannot start or a set-up
    command of the task fails (an infrastructure error, not the agent's).
    """

    def __init__(self, task: dict[str, Any], sandbox_cfg: SandboxConfig, seed: int,
                 extra_files: dict[str, str] | None = None):
        self.task, self.cfg, self.seed = task, sandbox_cfg, seed
        self.workspace: dict[str, Any] = json.loads(task.get("workspace") or "{}")
        self.extra_files = dict(extra_files or {})  # the harness's own files (a ``file`` skill)
        self._sandbox: Sandbox | None = None
        self._browser: Any = None

    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            sbx = make_sandbox(self.cfg)
            self._sandbox = sbx
            for path, text in sorted(self.workspace.get("files", {}).items()):
                try:
                    sbx.write_file(path, text)
                except (SandboxPathError, OSError) as e:  # the task's own files do not fit: not the agent's doing
                    raise SandboxError(f"task {self.task['task_id']!r}: workspace file {path!r}: {e}") from e
            for path, text in sorted(self.extra_files.items()):
                try:
                    sbx.write_file(path, text)
                except (SandboxPathError, OSError) as e:
                    raise SandboxError(f"harness file {path!r}: {e}") from e
            for cmd in self.workspace.get("setup", []):
                res = sbx.exec(["bash", "-c", cmd], timeout_s=self.cfg.wall_s)
                if res.status != "ok":
                    raise SandboxError(f"task {self.task['task_id']!r}: set-up command {cmd!r} ended {res.status}: "
                                       f"{res.combined_output()[-300:]}")
        return self._sandbox

    def browser_session(self) -> Any:
        if self._browser is None:
            from tasks.environments.browser import open_browser
            from tasks.records.suites.base import import_suite_modules

            import_suite_modules()  # each suite registers its browser
            self._browser = open_browser(self.task, self.seed)
        return self._browser

    @property
    def browser(self) -> Any:
        return self._browser

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.cleanup()
            self._sandbox = None
        if self._browser is not None:
            self._browser.close()
            self._browser = None


@dataclass
class _Episode:
    job: EpisodeJob
    env: EpisodeEnv
    prompt: list[int] = field(default_factory=list)
    # what the next turn row stores of its prompt (tasks.rollout.turns): the whole first prompt,
    # then each turn's continuation (observation and chat-format tokens)
    prompt_cols: dict[str, Any] = field(default_factory=dict)
    input_tokens: int = 0
    spans0: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    # the answer came from the harness's own format (its answer pattern or a submit tool), not the
    # fallback (the last number of the final reply): P1's "the policy speaks the harness"
    answer_parsed: bool = False
    done: bool = False
    status: str = "ok"
    error: str = ""
    wall_s: float = 0.0
    last_text: str = ""
    out_of_turns: bool = False
    cut: bool = False  # the context budget ended it, or its last reply was cut at max_new_tokens
    state: Any = None  # the engine's keys and values of the last turn, for the next (takes_states)
    # per turn: [start, end] (Unix seconds) of the engine call that sampled it, and the number of
    # requests in that call (a batch shares one call); not in any artifact (not reproducible)
    turn_times: list[list[float]] = field(default_factory=list)
    # per turn: the tool calls that ran, each ``{"tool", "start", "end", "status", "exit_code"}`` and
    # either ``shown``: ``[offset, length]`` of its text in the turn's observation, or ``output``:
    # its text when no observation showed it (the episode ended); not in any artifact either
    tool_calls: list[list[dict[str, Any]]] = field(default_factory=list)

    def stop_reason(self) -> str:
        """One of :data:`STOP_REASONS` for a finished episode."""
        if self.status in ("infra_error", "timeout"):
            return self.status
        if self.cut:
            return "max_tokens"
        if self.answer is None and self.job.task.get("environment") == "answer":
            return "format_error"
        return "max_turns" if self.out_of_turns else "submitted"


def truncate(text: str, limit: int, how: str) -> str:
    """Cut ``text`` to ``limit`` characters keeping the head, the tail or both ends, with a note
    saying how many characters were cut."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if how == "tail":
        return f"[...{cut} characters cut]\n" + text[-limit:]
    if how == "head_tail":
        h = limit // 2
        return text[:h] + f"\n[...{cut} characters cut...]\n" + text[len(text) - (limit - h):]
    return text[:limit] + f"\n[...{cut} more characters cut]"


def _files_text(spec: HarnessSpec, files: dict[str, str]) -> str:
    parts = []
    for path, text in sorted(files.items()):
        parts.append(f"{path}\n```\n{truncate(text, spec.context.file_max_chars, 'head')}\n```")
    return "\n\n".join(parts)


def _start(ep: _Episode, spec: HarnessSpec, chat: ChatFormat, tok: Any) -> None:
    """Set up the environment and the first prompt with its read spans."""
    task = ep.job.task
    files: dict[str, str] = ep.env.workspace.get("files", {})
    page = ""
    if task.get("environment") == "browser":
        page = ep.env.browser_session().observe()
    elif task.get("environment") == "workspace":
        ep.env.sandbox()  # the work dir exists before the agent's first action
    user = render(spec.instance_template, instruction=task["instruction"], files=_files_text(spec, files),
                  file_list="\n".join(sorted(files)) or "(empty)", page=page)
    system = spec.render_system()
    demos = spec.chat_messages()
    ep.prompt = chat.initial(system, user, demos)
    ep.prompt_cols = first_turn(ep.prompt)

    def span(source: str, text: str, **extra: Any) -> dict[str, Any]:
        return {"source": source, "turn": 0, "tokens": len(tok.encode(text, add_special_tokens=False)),
                "sha256": sha256_text(text), **extra}

    ep.spans0 = [span("system", spec.system_prompt)]
    if spec.skill and spec.skill_placement == "system_prompt":  # in the context from turn 0, by construction
        ep.spans0.append(span("skill", spec.skill))
    for i, m in enumerate(demos):  # the harness's demonstrations, in the context from turn 0
        ep.spans0.append(span("demonstration", m["content"], index=i, role=m["role"]))
    ep.spans0.append(span("instruction", task["instruction"]))
    if "{files}" in spec.instance_template:
        ep.spans0 += [span("file", t, path=p) for p, t in sorted(files.items())]
    if page:
        ep.spans0.append(span("page", page))


SKILL_PROBE_CHARS = 120


def read_skill(spec: HarnessSpec, files_read: tuple[str, ...], text: str) -> bool:
    """Whether a tool result showed the agent ``spec``'s ``file`` skill: the tool read the skill
    file (``files_read`` holds ``skill_path``, e.g. ``read_file``), or its output holds the skill's
    opening :data:`SKILL_PROBE_CHARS` characters (the whole skill when shorter) verbatim, e.g.
    code that printed the file; an observation cut short still holds the opening. Always False
    for a skill in the system prompt."""
    if not spec.skill or spec.skill_placement != "file":
        return False
    if spec.skill_path in {p.removeprefix("./") for p in files_read}:
        return True
    probe = spec.skill.strip()[:SKILL_PROBE_CHARS]
    return bool(probe) and probe in text


def _run_calls(ep: _Episode, spec: HarnessSpec, parsed: ParsedReply, sandbox_cfg: SandboxConfig
               ) -> tuple[list[tuple[str, ToolOutput]], bool]:
    """Run the reply's tool calls in order; returns ((tool, output) pairs, episode submitted)."""
    outs: list[tuple[str, ToolOutput]] = []
    timed = ep.tool_calls[-1]
    for call in parsed.calls:
        tool = spec.tool(call.tool)
        assert tool is not None
        timeout = min(tool.timeout_s, sandbox_cfg.wall_s) if IMPLS[call.impl].needs == "sandbox" else tool.timeout_s
        t0 = time.time()
        try:
            out = IMPLS[call.impl].run(ep.env, call.args, timeout)
        except (SandboxPathError, OSError) as e:
            # a path the sandbox refuses (symlink, not a regular file), a missing file, a full
            # work dir: the agent's mistake, shown to it like any other tool error
            out = ToolOutput(f"Error: {e}")
        timed.append({"tool": call.tool, "start": t0, "end": time.time(), "status": out.status,
                      "exit_code": out.exit_code,
                      "output": truncate(out.text, spec.context.observation_max_chars, spec.context.truncation)})
        outs.append((call.tool, out))
        if out.submitted:
            if out.answer is not None:
                ep.answer, ep.answer_parsed = out.answer, True
            return outs, True
    return outs, False


def _step(ep: _Episode, spec: HarnessSpec, g: Generation, turn: int, sandbox_cfg: SandboxConfig
          ) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Act on one reply; returns (observation text, observation spans without positions, action
    record). Sets ``ep.done``/``ep.answer``/``ep.status``."""
    t0 = time.monotonic()
    turns_left = spec.max_turns - turn - 1
    parsed = parse_reply(spec, g.text)
    ep.last_text = g.text
    action: dict[str, Any] = parsed.to_json()
    spans: list[dict[str, Any]] = []
    observation = shown = ""
    ep.tool_calls.append([])
    try:
        if spec.loop_type == "single_turn":
            ep.done = True
        else:
            outs, submitted = _run_calls(ep, spec, parsed, sandbox_cfg)
            if outs:  # each call's exec status ("ok", "error": non-zero exit, ...): P6's tool errors
                action["tool_status"] = [out.status for _, out in outs]
            browser_done = bool(ep.env.browser is not None and ep.env.browser.done())
            if submitted or parsed.answer is not None or browser_done:
                ep.done = True
            elif turns_left == 0:
                ep.done = ep.out_of_turns = True
            elif outs:
                texts = []
                for (name, out), timed in zip(outs, ep.tool_calls[-1]):
                    text = truncate(out.text, spec.context.observation_max_chars, spec.context.truncation)
                    texts.append(render(spec.observation_template, output=text, turns_left=turns_left, tool=name))
                    timed["shown"] = [sum(len(x) + 2 for x in texts[:-1]), len(texts[-1])]
                    skill = read_skill(spec, out.files_read, text)
                    if skill:  # the skill entered the context by the agent's action
                        spans.append({"source": "skill", "path": spec.skill_path, "tool": name})
                    spans += [{"source": "file", "path": p, "tool": name} for p in out.files_read
                              if not (skill and p.removeprefix("./") == spec.skill_path)]
                    if not out.files_read and not skill:
                        spans.append({"source": "tool_output", "tool": name})
                observation = shown = "\n\n".join(texts)
                if spec.loop_type == "reflect_on_test_failure" and spec.reflect is not None and not parsed.error:
                    res = ep.env.sandbox().exec(["bash", "-c", spec.reflect.command],
                                                timeout_s=min(spec.reflect.timeout_s, sandbox_cfg.wall_s))
                    action["reflect"] = {"status": res.status, "exit_code": res.exit_code}
                    if res.status == "ok":
                        ep.done, observation, spans = True, "", []
                    else:
                        out = truncate(res.combined_output().strip() or f"[{res.status}]",
                                       spec.context.observation_max_chars, spec.context.truncation)
                        observation = render(spec.reflect_template, output=out, turns_left=turns_left)
                        spans = [{"source": "tool_output", "tool": "reflect"}]
            elif parsed.error:
                observation = render(spec.format_error_template, error=f"Could not run the action: {parsed.error}.",
                                     turns_left=turns_left)
                spans.append({"source": "format_error"})
            elif spec.stop.on_no_action == "end":
                ep.done = True
            else:
                observation = render(spec.format_error_template, error="No action found in the reply.",
                                     turns_left=turns_left)
                spans.append({"source": "format_error"})
    except (SandboxError, BrowserError) as err:
        ep.status, ep.error, ep.done, observation, spans = "infra_error", str(err), True, "", []
    ep.wall_s += time.monotonic() - t0
    if ep.done and ep.answer is None and ep.status == "ok":
        if parsed.answer is not None:
            ep.answer, ep.answer_parsed = parsed.answer, True
        else:
            ep.answer = fallback_answer(spec, g.text)
    if (not ep.done and spec.limits.episode_wall_s is not None and ep.wall_s > spec.limits.episode_wall_s):
        ep.status, ep.done, observation, spans = "timeout", True, "", []
    if ep.done and g.finish_reason == "length":
        ep.cut = True
    for call in ep.tool_calls[-1]:  # a call's text is kept only where the observation does not show it
        if shown and observation == shown:
            call.pop("output")
        else:
            call.pop("shown", None)
    return observation, spans, action


def _finish_workspace(ep: _Episode, spec: HarnessSpec) -> None:
    """Single-reply harnesses on workspace tasks: write the reply's last code block (or, without
    one, the whole reply) to the task's ``answer_file``."""
    path = ep.env.workspace.get("answer_file")
    if path and spec.action_format == "final_answer" and ep.status == "ok":
        ep.env.sandbox().write_file(path, last_code_block(ep.last_text) or ep.last_text)


class _Sampled:
    """A turn's ``on_turns`` for the requests of its batch: passes on at most ``limit`` in all,
    counting them in ``n``."""

    def __init__(self, report: Callable[[int], None], limit: int) -> None:
        self.report, self.limit, self.n = report, limit, 0

    def __call__(self, k: int) -> None:
        k = min(k, self.limit - self.n)
        if k > 0:
            self.n += k
            self.report(k)


def request_seeds(jobs: list[EpisodeJob], turn: int, policy: Any) -> list[int] | None:
    """Common random numbers: per request, ``seed_from(job.noise_seed, turn)`` when the jobs carry
    noise seeds (records with a ``noise_key``), so two harnesses' episodes of the same (task,
    sample) draw the same sampler noise at each turn; None when no job carries one.

    Raises:
        ValueError: some jobs carry a noise seed and some do not, or the policy cannot take
            per-request seeds (``request_seeds_supported``; the vLLM engine can).
    """
    keyed = [j.noise_seed is not None for j in jobs]
    if not any(keyed):
        return None
    if not all(keyed):
        raise ValueError("request_seeds: a batch mixes records with and without a noise_key")
    if not getattr(policy, "request_seeds_supported", False):
        raise ValueError(f"request_seeds: the policy {type(policy).__name__} cannot take per-request seeds, so records "
                         "with a noise_key (common random numbers) cannot run on it (use policy.engine: vllm)")
    return [seed_from(j.noise_seed, turn) for j in jobs]  # type: ignore[arg-type]


def run_episodes(policy: Policy, spec: HarnessSpec, jobs: list[EpisodeJob], sandbox_cfg: SandboxConfig,
                 *, seed: int, on_turns: Callable[[int], None] | None = None
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``jobs`` (all under harness ``spec``) to completion.

    Progress: ``on_turns(n)``, when given, is called after each turn's batch with the number of
    turn slots it used up, where every episode has ``spec.max_turns`` slots: one per episode that
    took the turn, plus the slots left to each episode that ended (or could not start); during the
    batch, with one slot per request the engine reports finished (:func:`tasks.progress.
    requests_done`), those slots then not counted again. Over a call the counts add up to exactly
    ``len(jobs) * spec.max_turns``.

    Seeding: turn t's batch is sampled with ``seed_from(seed, harness_id, t, ids of the episodes
    still running)``, so the same jobs in the same order give the same tokens.

    Returns:
        ``(episodes, turns)`` row dicts: episode fields known to the engine (episode_id, reward,
        success, status, ``stop_reason`` (:data:`STOP_REASONS`), num_turns, input_tokens,
        output_tokens, final_answer, ``error``: why
        an episode ended ``infra_error`` or ``timeout``, else "", and ``turn_times``: per turn
        ``[start, end, n]``, the Unix seconds of the engine call that sampled it and the ``n``
        requests that call batched, and ``tool_calls``: per turn the tool calls that ran, with their
        Unix start and end, exec status and exit code (see ``_Episode.tool_calls``), both kept out
        of every artifact since they differ between runs; the Inspect logs show them) and full
        ``turns`` rows. The
        caller adds record and policy columns.

    Raises:
        ValueError: a turn's prompt does not extend the previous turn's prompt + completion
            exactly (token accounting drift); the episode would be unusable for training; a
            spec of a loop type the engine does not run (an application's plugin runs it,
            :mod:`tasks.rollout.loop_plugins`).
    """
    if spec.loop_type not in ENGINE_LOOP_TYPES:
        raise ValueError(f"harness {spec.name!r}: loop_type {spec.loop_type} is not run by the harness engine but by a "
                         f"plugin (an application's, tasks.registries.applications, via tasks.rollout.runner.run_records); "
                         "run it through tasks.rollout.runner.run_records")
    tok = policy.tokenizer
    chat = ChatFormat(tok)
    extra = {spec.skill_path: spec.skill} if spec.skill and spec.skill_placement == "file" else None
    skill_tokens = len(tok.encode(spec.skill, add_special_tokens=False)) if extra else 0
    eps = [_Episode(job=j, env=EpisodeEnv(j.task, sandbox_cfg, j.seed, extra)) for j in jobs]
    workers = max(1, min(sandbox_cfg.parallel, len(eps)))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="harness-tools")
    try:
        def start(e: _Episode) -> None:
            try:
                _start(e, spec, chat, tok)
            except SandboxError as err:
                e.status, e.error, e.done = "infra_error", str(err), True
                e.prompt = e.prompt or chat.initial(spec.render_system(), e.job.task["instruction"], spec.chat_messages())

        list(pool.map(start, eps))
        report = on_turns or (lambda n: None)
        # the context budget: the spec's, capped by what the policy's model can hold
        limits = [x for x in (spec.context.max_context_tokens, getattr(policy, "max_model_len", None)) if x]
        limit = min(limits) if limits else None
        for e in eps:
            if limit is not None and e.status == "ok" and len(e.prompt) + spec.sampling.max_new_tokens > limit:
                e.status, e.done = "infra_error", True
                e.error = (f"the first prompt ({len(e.prompt)} tokens) + max_new_tokens "
                           f"({spec.sampling.max_new_tokens}) exceeds the context budget of {limit} tokens")
        report(spec.max_turns * sum(e.done for e in eps))
        stateful = spec.max_turns > 1 and takes_states(policy)
        for turn in range(spec.max_turns):
            active = [e for e in eps if not e.done]
            if not active:
                break
            turn_seed = seed_from(seed, spec.harness_id, turn, [e.job.episode_id for e in active])
            crn = request_seeds([e.job for e in active], turn, policy)
            # requests the engine reports finished move the bar within the batch: one slot each
            sampled = _Sampled(report, len(active))
            t_start = time.time()
            with on_requests_done(sampled):
                extra = {} if crn is None else {"request_seeds": crn}
                if stateful:  # each episode's previous turn's keys and values; kept unless it is the last turn
                    gens = policy.generate([e.prompt for e in active], spec.sampling, turn_seed,
                                           states=[e.state for e in active], keep_states=turn < spec.max_turns - 1,
                                           **extra)
                else:
                    gens = policy.generate([e.prompt for e in active], spec.sampling, turn_seed, **extra)
            t_end = time.time()
            for e in active:
                e.turn_times.append([t_start, t_end, float(len(active))])
            fault_point(f"rollout:{spec.name}:turn:{turn}")  # crash tests: a worker dying mid-shard
            results = list(pool.map(lambda eg: _step(eg[0], spec, eg[1], turn, sandbox_cfg), zip(active, gens)))
            for e, g, (observation, obs_spans, action) in zip(active, gens, results):
                e.state = g.state
                spans = list(e.spans0) if turn == 0 else []
                e.input_tokens += len(e.prompt)
                row = {
                    "episode_id": e.job.episode_id,
                    "turn_idx": turn,
                    **e.prompt_cols,
                    "completion_token_ids": g.token_ids,
                    "completion_logprobs": g.logprobs,
                    "loss_mask": [1] * len(g.token_ids),
                    "completion_text": g.text,
                    "finish_reason": g.finish_reason,
                    "action": canonical_json(action),
                    "observation": observation,
                    "read_spans": "",
                }
                e.turns.append(row)
                if not e.done:
                    cont = chat.continuation(g.token_ids, observation)
                    base = e.prompt + g.token_ids
                    new_prompt = base + cont
                    if new_prompt[: len(base)] != base:
                        raise ValueError(f"episode {e.job.episode_id}: turn {turn + 1} prompt does not extend turn {turn}")
                    start_pos, end_pos = len(base), len(new_prompt)
                    for s in obs_spans:
                        # a skill read is identified by the skill's text (one graph node however it
                        # was read) and counts the skill's tokens; other spans the observation's
                        text_sha, n_tok = ((sha256_text(spec.skill), skill_tokens) if s["source"] == "skill" and spec.skill
                                           else (sha256_text(observation), len(cont)))
                        spans.append({**s, "turn": turn + 1, "tokens": n_tok, "start": start_pos, "end": end_pos,
                                      "sha256": text_sha})
                    if limit is not None and len(new_prompt) + spec.sampling.max_new_tokens > limit:
                        e.done = e.cut = True
                        e.answer = fallback_answer(spec, g.text)
                        action["context_limit"] = True
                        row["action"] = canonical_json(action)
                    else:
                        e.prompt = new_prompt
                        e.prompt_cols = next_turn(cont)
                if e.done:
                    e.state = None
                row["read_spans"] = canonical_json(spans)
            report(len(active) - sampled.n + (spec.max_turns - turn - 1) * sum(e.done for e in active))

        def finish(e: _Episode) -> dict[str, Any]:
            reward = 0.0
            if e.status == "ok":
                try:
                    if e.job.task.get("environment") == "workspace":
                        _finish_workspace(e, spec)
                    reward = grade(e.job.task["verifier_kind"], e.job.task["verifier_spec"], e.answer, e.env)
                except (VerifierError, SandboxError) as err:
                    e.status, e.error = "infra_error", str(err)
            e.env.close()
            if e.status != "ok":
                log.warning("episode %s (task %s, harness %s): %s: %s", e.job.episode_id[:12], e.job.task["task_id"],
                            spec.name, e.status, e.error)
            return {
                "episode_id": e.job.episode_id,
                "reward": reward,
                "success": e.status == "ok" and reward >= 1.0,
                "status": e.status,
                "stop_reason": e.stop_reason(),
                "num_turns": len(e.turns),
                "input_tokens": e.input_tokens,
                "output_tokens": sum(len(t["completion_token_ids"]) for t in e.turns),
                "final_answer": e.answer,
                "answer_parsed": e.answer is not None and e.answer_parsed,
                "error": e.error,
                "turn_times": e.turn_times,
                "tool_calls": e.tool_calls,
            }

        episodes = list(pool.map(finish, eps))
    finally:
        pool.shutdown(wait=True)
        for e in eps:
            e.env.close()
    turns = [t for e in eps for t in e.turns]
    return episodes, turns
