"""A harness as data: system prompt, instance template, tools, action format, control loop, stop
condition, context policy, sampling, limits and an optional skill, validated by pydantic and
hashed into ``harness_id``.

One engine (:mod:`tasks.rollout.harness`) interprets every spec; adding a harness is adding a YAML
file under ``tasks/harnesses/specs/``. A spec is refused on load, with the file, key and value in
the message, when it names a tool implementation the engine does not have, a template variable
its template may not use, an action format its tools cannot carry out, or an argument mapping
that does not fit the tool's JSON schema.

Templates use ``{name}`` placeholders (``{{``/``}}`` for literal braces next to a word); any other
brace text, such as a JSON example in a system prompt, is left as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.harnesses.tools import IMPLS
from tasks.hashing import canonical_json, sha256_json
from tasks.yamlfile import describe, load_mapping

SPEC_DIR = Path(__file__).parent / "specs"
ENVIRONMENTS = ("answer", "workspace", "browser")
ActionFormat = Literal["final_answer", "function_call", "xml_tags", "fenced_code", "whole_file", "search_replace"]
# the loop types the harness engine (tasks.rollout.harness) runs; an application registers any other
# (tasks.registries.applications), with the harness-spec section it needs
ENGINE_LOOP_TYPES = ("single_turn", "react", "codeact", "reflect_on_test_failure")

# Variables each template may use.
TEMPLATE_VARS: dict[str, set[str]] = {
    "system_prompt": {"tools"},
    "instance_template": {"instruction", "files", "file_list", "page"},
    "observation_template": {"output", "turns_left", "tool"},
    "format_error_template": {"turns_left", "error"},
    "reflect_template": {"output", "turns_left"},
}
_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")


def placeholders(text: str) -> set[str]:
    """The ``{name}`` placeholders in a template (``{{name}}`` is a literal)."""
    return set(_PLACEHOLDER.findall(text))


def render(text: str, **values: Any) -> str:
    """Fill ``{name}`` placeholders; ``{{name}}`` becomes a literal ``{name}``.

    Raises:
        KeyError: a placeholder with no value (load-time validation makes this unreachable).
    """
    out = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)
    return re.sub(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}", r"{\1}", out)


class HarnessError(ValueError):
    """A harness spec that cannot be used; the message names the file, the key and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolSpec(_Strict):
    """A tool the policy may call, as its harness family names it.

    ``impl``: the implementation in :data:`tasks.harnesses.tools.IMPLS` (default: ``name``).
    ``parameters``: the JSON schema of the call's arguments (``{"type": "object", "properties":
    ...}``), shown to the model and checked on every call. ``arguments``: implementation parameter
    -> property name in ``parameters`` where they differ (Qwen Code's ``absolute_path`` for
    ``read_file``'s ``path``). ``timeout_s``: wall-clock seconds per call in the sandbox.
    """

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    impl: str | None = None
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    arguments: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=5.0, gt=0)

    @property
    def impl_name(self) -> str:
        return self.impl or self.name

    def arg(self, param: str) -> str:
        """The property name carrying implementation parameter ``param``."""
        return self.arguments.get(param, param)

    @model_validator(mode="after")
    def _check(self) -> "ToolSpec":
        impl = IMPLS.get(self.impl_name)
        if impl is None:
            raise ValueError(f"tools[{self.name}]: unknown tool implementation {self.impl_name!r}; the engine has "
                             f"{sorted(IMPLS)} (set impl: to bind a new name to one of them)")
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError as e:
            raise ValueError(f"tools[{self.name}].parameters is not a JSON schema: {e.message}") from None
        if self.parameters.get("type") != "object":
            raise ValueError(f"tools[{self.name}].parameters.type must be 'object', not {self.parameters.get('type')!r}")
        props = set(self.parameters.get("properties", {}))
        bad = set(self.arguments) - set(impl.params) - set(impl.optional)
        if bad:
            raise ValueError(f"tools[{self.name}].arguments maps {sorted(bad)}, which {impl.name} does not take "
                             f"(it takes {list(impl.params) + list(impl.optional)})")
        missing = [p for p in impl.params if self.arg(p) not in props]
        if missing:
            raise ValueError(f"tools[{self.name}].parameters lacks {[self.arg(p) for p in missing]}, required by "
                             f"implementation {impl.name}")
        return self


class SamplingSpec(_Strict):
    """Sampler settings. ``top_k`` 0 and ``top_p`` 1.0 mean off; ``max_new_tokens`` per turn."""

    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_new_tokens: int = Field(default=96, gt=0)


class StopSpec(_Strict):
    """When an episode ends, besides ``max_turns`` and a submit tool.

    ``answer_pattern``: a regex whose first group is a submitted answer (None: only a submit tool
    ends the episode). ``answer_fallback``: ``last_number`` takes the last number of the final
    reply when nothing was submitted; it is a property the harness declares (``direct``: its
    protocol is "the last number"), never a default of the grader: with ``none`` a reply outside
    the protocol has no answer and scores 0. ``on_no_action``: a reply with no action either gets
    the format-error observation (``continue``) or ends the episode (``end``: CodeAct's "message to
    the user", Aider's "no edits"). ``multiple_answers``: a reply whose answer pattern matches
    several times with different answers (a shotgun of tags) submits the ``first`` one, or
    (``reject``) none: the reply is out of protocol, and the last-number fallback does not apply
    to it either. Left out of the hashed JSON at ``first``, so adding it changed no ``harness_id``.
    """

    answer_pattern: str | None = r"(?i)answer\s*[:=]\s*(.+)"
    answer_fallback: Literal["none", "last_number"] = "none"
    on_no_action: Literal["continue", "end"] = "continue"
    multiple_answers: Literal["first", "reject"] = "first"


class Message(_Strict):
    """One chat turn of a demonstration: ``role`` user or assistant, ``content`` its text."""

    role: Literal["user", "assistant"]
    content: str = Field(min_length=1)


class Demonstration(_Strict):
    """One worked example of the harness's protocol, shown to the model as earlier chat turns
    between the system prompt and the task (few-shot): ``messages`` alternate user, assistant,
    user, ... and end with the assistant's final reply. In a tool loop the middle user turns are
    the observations the harness would show (rendered by the demonstration's author, as text).
    Load-time checks (:class:`HarnessSpec`): every non-final assistant turn is an action under the
    spec's action format, and the final one submits an answer under its answer pattern, so a
    demonstration can only show the protocol the harness grades by."""

    messages: list[Message] = Field(min_length=2)

    @model_validator(mode="after")
    def _check(self) -> "Demonstration":
        for i, m in enumerate(self.messages):
            want = "user" if i % 2 == 0 else "assistant"
            if m.role != want:
                raise ValueError(f"messages[{i}].role is {m.role!r}; a demonstration alternates user, assistant, ... "
                                 f"starting with user, so it must be {want!r}")
        if self.messages[-1].role != "assistant":
            raise ValueError(f"messages: a demonstration ends with the assistant's reply, not a {self.messages[-1].role} turn")
        return self


class ContextSpec(_Strict):
    """What enters the context. Observations longer than ``observation_max_chars`` are cut
    (``truncation``: keep the head, the tail, or both ends); ``file_max_chars`` caps each file
    shown by the ``{files}`` instance variable; ``max_context_tokens`` ends the episode when the
    next prompt would exceed it (earlier turns are never rewritten: every prompt extends the
    previous one token for token)."""

    observation_max_chars: int = Field(default=1000, ge=16)
    truncation: Literal["head", "tail", "head_tail"] = "head"
    file_max_chars: int = Field(default=4000, ge=16)
    max_context_tokens: int | None = Field(default=None, gt=0)


class ReflectSpec(_Strict):
    """``reflect_on_test_failure``: after a reply that edits files, run ``command`` (bash, in
    /app, ``timeout_s`` seconds); exit 0 ends the episode, anything else sends its output back."""

    command: str
    timeout_s: float = Field(default=10.0, gt=0)


class LimitsSpec(_Strict):
    """``episode_wall_s``: wall-clock seconds an episode may spend acting on its environment
    (tool calls, reflection checks); past it the episode ends with status ``timeout``. Generation
    time is not counted: it depends on the machine and the batch, and would make the same config
    and seed give different episodes on a slower host."""

    episode_wall_s: float | None = Field(default=None, gt=0)


class HarnessSpec(_Strict):
    """One harness.

    ``environments``: the task environments it can drive (``answer``, ``workspace``, ``browser``;
    freeze pairs a task only with harnesses that list its environment). ``action_format``:
    ``final_answer`` (only an answer), ``function_call`` (``<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>`` or a JSON object), ``xml_tags`` (``<tool><param>value</param></tool>``),
    ``fenced_code`` (a fenced block is run by the python or shell tool by its language),
    ``whole_file`` (a path line followed by a fenced block with the file's full content) or
    ``search_replace`` (a path line followed by ``<<<<<<< SEARCH`` / ``=======`` / ``>>>>>>>
    REPLACE`` blocks). ``loop_type``: ``single_turn``, ``react`` (act, observe, repeat),
    ``codeact`` (react whose actions are code; a reply without code ends the episode),
    ``reflect_on_test_failure`` (edit, run ``reflect.command``, feed failures back), or a loop type
    an application registers (:mod:`tasks.registries.applications`): the engine does not run it,
    and its spec carries the application's section (``harness_block``) under that key, validated by
    the application's model and ``check_harness``, an attribute of the spec like a field. A section
    is in the hashed JSON only when present, so adding one changed no existing ``harness_id``.

    ``skill`` (P2, BiPA): a natural-language procedure. ``skill_placement``: ``system_prompt``
    appends it to the system prompt as a "## Skill" section (in every turn's context: read at turn
    0 by construction); ``file`` writes it to ``skill_path`` (relative to the work dir /app) in the
    episode's sandbox before the first action and leaves it out of the prompt, so the agent sees it
    only by reading it with an action (``read_file``, or code that prints it): the system prompt
    should say where it is. The engine records such a read as a ``skill`` span
    (:mod:`tasks.rollout.harness`). ``skill_placement`` and ``skill_path`` are left out of the
    hashed JSON at their defaults, so adding them changed no existing ``harness_id``.
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    family: str
    description: str = ""
    environments: list[Literal["answer", "workspace", "browser"]] = Field(min_length=1)
    system_prompt: str
    instance_template: str
    observation_template: str = "{output}"
    format_error_template: str = "{error}"
    reflect_template: str = "The tests failed:\n{output}\nFix the code. ({turns_left} turns left)"
    tools: list[ToolSpec] = Field(default_factory=list)
    action_format: ActionFormat
    loop_type: str
    max_turns: int = Field(default=1, ge=1, le=1000)
    stop: StopSpec = Field(default_factory=StopSpec)
    context: ContextSpec = Field(default_factory=ContextSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    reflect: ReflectSpec | None = None
    skill: str | None = None
    skill_placement: Literal["system_prompt", "file"] = "system_prompt"
    skill_path: str = Field(default="SKILL.md", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
    demonstrations: list[Demonstration] = Field(default_factory=list)
    # an application's section (its harness_block) is kept as an extra attribute; any other
    # unknown key is refused by _check_application below
    model_config = ConfigDict(extra="allow", frozen=True)

    @field_validator("loop_type")
    @classmethod
    def _known_loop_type(cls, v: str) -> str:
        from tasks.registries.applications import loop_types

        known = ENGINE_LOOP_TYPES + loop_types()
        if v not in known:
            raise ValueError(f"Input should be {', '.join(repr(k) for k in known[:-1])} or {known[-1]!r}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "HarnessSpec":
        self._check_application()
        if self.skill_placement == "file":
            if not self.skill:
                raise ValueError("skill_placement file needs a skill to write")
            readers = {t.impl_name for t in self.tools} & {"read_file", "python", "shell"}
            if self.loop_type == "single_turn" or not readers:
                raise ValueError("skill_placement file needs a multi-turn loop and a tool that can read the file "
                                 f"(impl read_file, python or shell); this spec has loop_type {self.loop_type} and "
                                 f"tools {sorted(t.impl_name for t in self.tools)}")
            if ".." in self.skill_path.split("/"):
                raise ValueError(f"skill_path {self.skill_path!r} must stay inside the work dir")
        for key, allowed in TEMPLATE_VARS.items():
            bad = placeholders(getattr(self, key)) - allowed
            if bad:
                raise ValueError(f"{key} uses undefined variable(s) {sorted(bad)}; it may use {sorted(allowed)}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tools: duplicate names {names}")
        if self.stop.answer_pattern is not None:
            try:
                pat = re.compile(self.stop.answer_pattern)
            except re.error as e:
                raise ValueError(f"stop.answer_pattern {self.stop.answer_pattern!r} is not a regex: {e}") from None
            if pat.groups < 1:
                raise ValueError(f"stop.answer_pattern {self.stop.answer_pattern!r} needs one capture group (the answer)")
        impls = {t.impl_name for t in self.tools}
        if self.loop_type == "single_turn" and self.max_turns != 1:
            raise ValueError(f"max_turns={self.max_turns} with loop_type single_turn; it must be 1")
        if self.action_format == "final_answer" and self.tools:
            raise ValueError("action_format final_answer takes no tools")
        if self.action_format == "final_answer" and self.stop.answer_pattern is None and self.stop.answer_fallback == "none":
            raise ValueError("action_format final_answer needs stop.answer_pattern or stop.answer_fallback")
        if self.action_format in ("fenced_code",) and not impls & {"python", "shell"}:
            raise ValueError("action_format fenced_code needs a tool with impl python or shell to run the code")
        if self.action_format in ("function_call", "xml_tags") and not self.tools:
            raise ValueError(f"action_format {self.action_format} needs tools")
        if self.action_format == "whole_file" and "write_file" not in impls:
            raise ValueError("action_format whole_file needs a tool with impl write_file")
        if self.action_format == "search_replace" and "str_replace" not in impls:
            raise ValueError("action_format search_replace needs a tool with impl str_replace")
        if self.loop_type == "reflect_on_test_failure" and self.reflect is None:
            raise ValueError("loop_type reflect_on_test_failure needs a reflect: {command: ...} section")
        if self.loop_type == "codeact" and self.action_format not in ("fenced_code", "xml_tags", "function_call"):
            raise ValueError(f"loop_type codeact needs code actions, not action_format {self.action_format}")
        needs = {IMPLS[t.impl_name].needs for t in self.tools}
        if "browser" in needs and self.environments != ["browser"]:
            raise ValueError(f"browser tools need environments: [browser], not {self.environments}")
        if "sandbox" in needs and "browser" in self.environments:
            raise ValueError("a browser harness cannot have sandbox tools")
        if "workspace" in self.environments and self.loop_type != "single_turn" and not needs & {"sandbox"}:
            raise ValueError("a multi-turn harness for workspace tasks needs at least one sandbox tool")
        self._check_demonstrations()
        return self

    def _check_application(self) -> None:
        """Extra keys: only the section of the application whose loop type this spec has, validated
        by its model (then held as that model) and by its ``check_harness``."""
        from tasks.registries.applications import of_harness_block, of_loop_type

        extra = self.__pydantic_extra__ or {}
        for key in extra:
            owner = of_harness_block(key)
            if owner is None:
                raise ValueError(f"{key}: Extra inputs are not permitted (not a key of a harness spec)")
            if owner.loop_type != self.loop_type:
                raise ValueError(f"{key}: a {key} section is only for loop_type {owner.loop_type}, not loop_type "
                                 f"{self.loop_type}")
        app = of_loop_type(self.loop_type)
        if app is None:
            return
        if app.harness_block:
            if app.harness_block not in extra:
                raise ValueError(f"loop_type {self.loop_type} needs a {app.harness_block}: {{...}} section")
            block = extra[app.harness_block]
            if app.harness_block_model is not None and not isinstance(block, app.harness_block_model):
                try:
                    extra[app.harness_block] = app.harness_block_model.model_validate(block)
                except ValidationError as e:
                    raise ValueError("; ".join(
                        f"{'.'.join(str(x) for x in (app.harness_block, *err['loc']))}={err.get('input')!r}: "
                        f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())) from None
        if app.check_harness is not None:
            app.check_harness(self)

    def _check_demonstrations(self) -> None:
        """Every demonstration follows the spec's own protocol (see :class:`Demonstration`)."""
        if not self.demonstrations:
            return
        from tasks.harnesses.actions import parse_reply

        if self.loop_type == "single_turn" and any(len(d.messages) != 2 for d in self.demonstrations):
            raise ValueError("demonstrations: a single_turn harness's demonstration is one user turn and one "
                             "assistant reply")
        for i, d in enumerate(self.demonstrations):
            replies = d.messages[1::2]
            for j, m in enumerate(replies[:-1]):
                got = parse_reply(self, m.content)
                if not got.calls or got.error:
                    raise ValueError(f"demonstrations[{i}].messages[{2 * j + 1}] is not a {self.action_format} action "
                                     f"of this harness ({got.error or 'no tool call found'}): {m.content[:80]!r}")
            last = parse_reply(self, replies[-1].content)
            submits = [c for c in last.calls if c.impl == "submit"]
            if last.answer is None and not submits:
                raise ValueError(f"demonstrations[{i}]: the final reply submits no answer under stop.answer_pattern "
                                 f"{self.stop.answer_pattern!r} (nor a submit tool): {replies[-1].content[:80]!r}")

    def chat_messages(self) -> list[dict[str, str]]:
        """The demonstrations as chat messages (``[{"role": ..., "content": ...}]``, in order), to
        put between the system prompt and the task's first user turn; ``[]`` without any."""
        return [{"role": m.role, "content": m.content} for d in self.demonstrations for m in d.messages]

    def spec_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data: every field, an application's section and ``demonstrations``
        only when set, ``skill_placement``/``skill_path`` only when not both at their defaults and
        ``stop.multiple_answers`` only when not ``first`` (specs without them hash and serialise as
        before the fields existed; demonstrations are part of the hash)."""
        d = self.model_dump(mode="json")
        if d.get("skill_placement") == "system_prompt" and d.get("skill_path") == "SKILL.md":
            d.pop("skill_placement", None)
            d.pop("skill_path", None)
        if not d.get("demonstrations"):
            d.pop("demonstrations", None)
        if d["stop"].get("multiple_answers") == "first":
            d["stop"].pop("multiple_answers")
        return d

    @property
    def harness_id(self) -> str:
        """SHA-256 of the canonical JSON of the whole spec (:meth:`spec_dict`)."""
        return sha256_json(self.spec_dict())

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def tools_doc(self) -> str:
        """The ``{tools}`` text: one entry per tool with its JSON schema."""
        lines = []
        for t in self.tools:
            lines.append(f"- {t.name}: {t.description}\n  parameters: {canonical_json(t.parameters)}")
        return "\n".join(lines)

    def to_row(self) -> dict[str, Any]:
        d = self.spec_dict()
        return {
            "harness_id": self.harness_id,
            "name": self.name,
            "family": self.family,
            "system_prompt": self.system_prompt,
            "instance_template": self.instance_template,
            "tools": canonical_json(d["tools"]),
            "action_format": self.action_format,
            "loop_type": self.loop_type,
            "max_turns": self.max_turns,
            "limits": canonical_json({"context": d["context"], "limits": d["limits"],
                                      "tool_timeouts_s": {t.name: t.timeout_s for t in self.tools}}),
            "sampling": canonical_json(d["sampling"]),
            "spec_json": canonical_json(d),
        }

    def render_system(self) -> str:
        """The system prompt (``{tools}`` filled), with the skill section appended when the spec
        has one placed in the system prompt (a ``file`` skill is not in the prompt)."""
        text = render(self.system_prompt, tools=self.tools_doc())
        if self.skill and self.skill_placement == "system_prompt":
            return f"{text.rstrip()}\n\n## Skill\n{self.skill.strip()}"
        return text


def shipped_harnesses() -> list[str]:
    return sorted(x.stem for x in SPEC_DIR.glob("*.yaml"))


def load_harness(name_or_path: str | Path) -> HarnessSpec:
    """Load a harness spec by shipped name (``direct``) or by YAML path.

    Raises:
        HarnessError: no such spec, bad YAML, or a spec that fails validation (unknown tool,
            undefined template variable, ...); the message names the file, key and value.
    """
    p = Path(name_or_path)
    if not p.suffix:
        p = SPEC_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        raise HarnessError(f"harness {str(name_or_path)!r}: no file {p}; shipped harnesses: {shipped_harnesses()}")
    data = load_mapping(p, HarnessError)
    try:
        return HarnessSpec.model_validate(data)
    except ValidationError as e:
        raise HarnessError(describe(p, e)) from None
