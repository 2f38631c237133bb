"""Parsing a reply into actions, one parser per action format.

:func:`parse_reply` returns the tool calls in the reply (already mapped to implementation
parameters and checked against the tool's JSON schema), the submitted answer if the stop pattern
matched, and a format error when the reply tried to act but could not be understood. Parsing never
raises on model text: whatever the model writes, the engine gets a result it can show back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tasks.harnesses.tools import IMPLS

# The spec and tool types are named, not imported: tasks.harnesses.spec's demonstration check
# parses replies with this module, so importing the spec here (even for annotations) is a cycle.
HarnessSpec = Any  # a tasks.harnesses.spec.HarnessSpec
ToolSpec = Any  # a tasks.harnesses.spec.ToolSpec

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\n```|\Z)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_PY = {"python", "py", "python3", "ipython"}
_SH = {"bash", "sh", "shell", "console", "zsh"}


@dataclass(frozen=True)
class ToolCall:
    """One call: the harness's tool name, the implementation's name and its arguments keyed by
    the implementation's parameter names."""

    tool: str
    impl: str
    args: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "impl": self.impl, "args": self.args}


@dataclass
class ParsedReply:
    """``calls`` in reply order; ``answer`` the submitted answer (stop pattern) or None;
    ``error`` a message for the agent when an attempted action could not be parsed."""

    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"calls": [c.to_json() for c in self.calls], "answer": self.answer, "error": self.error}


def clean_answer(text: str) -> str:
    """Strip whitespace, a trailing full stop and thousands separators from a numeric-looking answer."""
    t = text.strip().rstrip(".").strip()
    return t.replace(",", "") if _NUMBER.fullmatch(t) else t


def pattern_answers(spec: HarnessSpec, text: str) -> list[str]:
    """Every answer ``stop.answer_pattern`` reads in ``text`` (cleaned, in order, repeats kept);
    ``[]`` when the spec has no pattern or it does not match. Only the reply's own text is read:
    neither the prompt nor the demonstrations."""
    if spec.stop.answer_pattern is None:
        return []
    return [clean_answer(m.group(1)) for m in re.finditer(spec.stop.answer_pattern, text) if m.group(1) is not None]


def protocol_answer(spec: HarnessSpec, text: str) -> str | None:
    """The answer ``text`` submits under the harness's answer pattern: the first match, or, with
    ``stop.multiple_answers: reject``, None when the matches disagree (several different tags)."""
    found = pattern_answers(spec, text)
    if not found:
        return None
    if spec.stop.multiple_answers == "reject" and len(set(found)) > 1:
        return None
    return found[0]


def fallback_answer(spec: HarnessSpec, text: str) -> str | None:
    """The answer when the agent never submitted one: the last number of its final reply, only
    where the harness declares it (``stop.answer_fallback: last_number``), else None. A reply the
    harness rejected for several different answers (``stop.multiple_answers: reject``) gets no
    fallback either: it tried the protocol and broke it."""
    if spec.stop.answer_fallback != "last_number":
        return None
    if spec.stop.multiple_answers == "reject" and len(set(pattern_answers(spec, text))) > 1:
        return None
    nums = _NUMBER.findall(text)
    return clean_answer(nums[-1]) if nums else None


def last_code_block(text: str) -> str | None:
    """The content of the last fenced code block in ``text`` (None when there is none)."""
    blocks = [b for _, b in _FENCE.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


def _call(spec: HarnessSpec, tool: ToolSpec, raw_args: Any) -> ToolCall | str:
    """Check ``raw_args`` against the tool's schema and map them to implementation parameters;
    a string is an error message for the agent."""
    import jsonschema

    if isinstance(raw_args, str):
        try:
            raw_args = json.loads(raw_args) if raw_args.strip() else {}
        except json.JSONDecodeError:
            return f"the arguments of {tool.name} are not a JSON object"
    if not isinstance(raw_args, dict):
        return f"the arguments of {tool.name} must be a JSON object, not {type(raw_args).__name__}"
    try:
        jsonschema.validate(raw_args, tool.parameters)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "arguments"
        return f"bad arguments for {tool.name} ({where}): {e.message}"
    impl = IMPLS[tool.impl_name]
    args = {p: raw_args[tool.arg(p)] for p in (*impl.params, *impl.optional) if tool.arg(p) in raw_args}
    return ToolCall(tool.name, impl.name, args)


def _json_objects(text: str) -> list[Any]:
    """JSON values decodable at each ``{`` of ``text``, left to right, not overlapping."""
    dec, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        try:
            obj, end = dec.raw_decode(text, i)
            out.append(obj)
            i = end
        except json.JSONDecodeError:
            i += 1
    return out


def _parse_function_call(spec: HarnessSpec, text: str) -> ParsedReply:
    tagged = _TOOL_CALL.findall(text)
    sources = tagged if tagged else [text]
    for src in sources:
        for obj in _json_objects(src):
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                tool = spec.tool(obj["name"])
                if tool is None:
                    return ParsedReply(error=f"unknown tool {obj['name']!r}; the tools are {[t.name for t in spec.tools]}")
                call = _call(spec, tool, obj.get("arguments", obj.get("parameters", {})))
                return ParsedReply(error=call) if isinstance(call, str) else ParsedReply(calls=[call])
    if tagged:
        return ParsedReply(error="the <tool_call> holds no JSON object with a \"name\"")
    return ParsedReply()


def _coerce(value: str, schema: dict[str, Any]) -> Any:
    t = schema.get("type")
    try:
        if t == "integer":
            return int(value.strip())
        if t == "number":
            return float(value.strip())
        if t == "boolean":
            return value.strip().lower() in ("true", "1", "yes")
    except ValueError:
        return value
    return value


def _strip_nl(s: str) -> str:
    return s[1:] if s.startswith("\n") else s


def _parse_xml_tags(spec: HarnessSpec, text: str) -> ParsedReply:
    best: tuple[int, ToolSpec, str] | None = None
    for tool in spec.tools:
        m = re.search(rf"<{re.escape(tool.name)}>(.*?)</{re.escape(tool.name)}>", text, re.DOTALL)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), tool, m.group(1))
    if best is None:
        opened = [t.name for t in spec.tools if f"<{t.name}>" in text]
        return ParsedReply(error=f"<{opened[0]}> is never closed") if opened else ParsedReply()
    _, tool, inner = best
    props: dict[str, Any] = tool.parameters.get("properties", {})
    raw: dict[str, Any] = {}
    for name, sch in props.items():
        m = re.search(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", inner, re.DOTALL)
        if m:
            raw[name] = _coerce(_strip_nl(m.group(1)).rstrip("\n") if sch.get("type") != "string" else
                                _strip_nl(m.group(1)), sch)
    required = tool.parameters.get("required", [])
    if not raw and len(required) == 1:
        raw[required[0]] = _coerce(_strip_nl(inner), props.get(required[0], {}))
    call = _call(spec, tool, raw)
    return ParsedReply(error=call) if isinstance(call, str) else ParsedReply(calls=[call])


def _parse_fenced_code(spec: HarnessSpec, text: str) -> ParsedReply:
    code_tools = {t.impl_name: t for t in spec.tools if t.impl_name in ("python", "shell")}
    for lang, body in _FENCE.findall(text):
        if not body.strip():
            continue
        lang = lang.lower()
        impl = "python" if lang in _PY else "shell" if lang in _SH else None
        if impl is None and len(code_tools) == 1 and lang in ("", "text"):
            impl = next(iter(code_tools))
        if impl is None or impl not in code_tools:
            continue  # e.g. a bash block for a python-only harness, or a block of output: not an action
        tool = code_tools[impl]
        return ParsedReply(calls=[ToolCall(tool.name, impl, {"code" if impl == "python" else "command": body})])
    return ParsedReply()


_PATH_LINE = re.compile(r"^[ \t]*[`*]*([A-Za-z0-9_./-]+\.[A-Za-z0-9]+|[A-Za-z0-9_./-]*/[A-Za-z0-9_.-]+)[`*:]*[ \t]*$")


def _parse_whole_file(spec: HarnessSpec, text: str) -> ParsedReply:
    tool = next(t for t in spec.tools if t.impl_name == "write_file")
    calls = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _PATH_LINE.match(lines[i])
        if m and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("```"):
            j = i + 2
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            content = "\n".join(lines[i + 2:j]) + "\n"
            calls.append(ToolCall(tool.name, "write_file", {"path": m.group(1), "content": content}))
            i = j + 1
        else:
            i += 1
    return ParsedReply(calls=calls)


def _parse_search_replace(spec: HarnessSpec, text: str) -> ParsedReply:
    rep = next(t for t in spec.tools if t.impl_name == "str_replace")
    create = next((t for t in spec.tools if t.impl_name == "write_file"), None)
    calls, path, i = [], None, 0
    lines = text.split("\n")
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<<<<<<< SEARCH":
            try:
                mid = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "=======")
                end = next(k for k in range(mid + 1, len(lines)) if lines[k].strip().startswith(">>>>>>> REPLACE"))
            except StopIteration:
                return ParsedReply(calls=calls, error="a SEARCH block is not closed by ======= and >>>>>>> REPLACE")
            if path is None:
                return ParsedReply(calls=calls, error="a SEARCH/REPLACE block must follow a line with the file path")
            old, new = "\n".join(lines[i + 1:mid]), "\n".join(lines[mid + 1:end])
            if old.strip():
                calls.append(ToolCall(rep.name, "str_replace", {"path": path, "old": old, "new": new}))
            elif create is not None:
                calls.append(ToolCall(create.name, "write_file", {"path": path, "content": new + "\n"}))
            else:
                return ParsedReply(calls=calls, error=f"an empty SEARCH for {path} would create a file; this harness cannot")
            i = end + 1
            continue
        m = _PATH_LINE.match(line)
        if m and not line.lstrip().startswith("```"):
            path = m.group(1)
        i += 1
    return ParsedReply(calls=calls)


_PARSERS = {
    "function_call": _parse_function_call,
    "xml_tags": _parse_xml_tags,
    "fenced_code": _parse_fenced_code,
    "whole_file": _parse_whole_file,
    "search_replace": _parse_search_replace,
}


def parse_reply(spec: HarnessSpec, text: str) -> ParsedReply:
    """The actions and the answer in one reply under ``spec``'s action format."""
    out = _PARSERS[spec.action_format](spec, text) if spec.action_format in _PARSERS else ParsedReply()
    out.answer = protocol_answer(spec, text)
    return out
