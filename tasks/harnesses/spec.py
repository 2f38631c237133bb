"""A harness as data: system prompt, instance template, tools, action format, control loop,
limits and sampling, validated by pydantic and hashed into ``harness_id``.

One engine (:mod:`tasks.rollout.harness`) interprets every spec; adding a harness is adding a YAML
file under ``tasks/harnesses/specs/``.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.hashing import canonical_json, sha256_json
from tasks.yamlfile import describe, load_mapping

SPEC_DIR = Path(__file__).parent / "specs"

# Tools the engine knows how to run, with the sandbox command each maps to.
KNOWN_TOOLS = {"python"}
# Variables each template may use.
TEMPLATE_VARS = {
    "instance_template": {"instruction"},
    "observation_template": {"output", "turns_left"},
    "format_error_template": {"turns_left"},
}


class HarnessError(ValueError):
    """A harness spec that cannot be used; the message names the file, the key and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolSpec(_Strict):
    """A tool the policy may call. ``timeout_s`` in seconds (wall clock in the sandbox)."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=dict)  # JSON schema of the arguments
    timeout_s: float = Field(default=5.0, gt=0)


class SamplingSpec(_Strict):
    """Sampler settings. ``top_k`` 0 and ``top_p`` 1.0 mean off; ``max_new_tokens`` per turn."""

    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_new_tokens: int = Field(default=96, gt=0)


class HarnessSpec(_Strict):
    """One harness.

    ``loop_type``: ``single_turn`` (one completion, then grade) or ``react`` (act, observe, repeat
    until an answer or ``max_turns``). ``action_format``: ``final_answer`` (only an answer) or
    ``fenced_code`` (a fenced code block in the tool's language is run by that tool).
    ``answer_pattern`` is a regex whose first group is the submitted answer; ``answer_fallback``
    ``last_number`` takes the last number of the final completion when no pattern matched.
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    family: str
    description: str = ""
    system_prompt: str
    instance_template: str
    observation_template: str = "Output:\n{output}"
    format_error_template: str = "No code block and no answer found."
    tools: list[ToolSpec] = Field(default_factory=list)
    action_format: Literal["final_answer", "fenced_code"]
    loop_type: Literal["single_turn", "react"]
    max_turns: int = Field(default=1, ge=1, le=1000)
    answer_pattern: str = r"(?i)answer\s*[:=]\s*(.+)"
    answer_fallback: Literal["none", "last_number"] = "last_number"
    observation_max_chars: int = Field(default=1000, ge=16)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    skill: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "HarnessSpec":
        for t in self.tools:
            if t.name not in KNOWN_TOOLS:
                raise ValueError(f"tools: unknown tool {t.name!r}; the engine knows {sorted(KNOWN_TOOLS)}")
        for key, allowed in TEMPLATE_VARS.items():
            text = getattr(self, key)
            used = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
            bad = used - allowed
            if bad:
                raise ValueError(f"{key} uses undefined variable(s) {sorted(bad)}; it may use {sorted(allowed)}")
        try:
            pat = re.compile(self.answer_pattern)
        except re.error as e:
            raise ValueError(f"answer_pattern {self.answer_pattern!r} is not a regex: {e}") from None
        if pat.groups < 1:
            raise ValueError(f"answer_pattern {self.answer_pattern!r} needs one capture group (the answer)")
        if self.loop_type == "single_turn" and self.max_turns != 1:
            raise ValueError(f"max_turns={self.max_turns} with loop_type single_turn; it must be 1")
        if self.action_format == "fenced_code" and not self.tools:
            raise ValueError("action_format fenced_code needs a tool to run the code")
        return self

    @property
    def harness_id(self) -> str:
        """SHA-256 of the canonical JSON of the whole spec."""
        return sha256_json(self.model_dump(mode="json"))

    def to_row(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
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
            "limits": canonical_json({"observation_max_chars": self.observation_max_chars,
                                      "tool_timeouts_s": {t.name: t.timeout_s for t in self.tools}}),
            "sampling": canonical_json(d["sampling"]),
            "spec_json": canonical_json(d),
        }

    def render_system(self) -> str:
        """The system prompt, with the skill section appended when the spec has one."""
        if self.skill:
            return f"{self.system_prompt.rstrip()}\n\n## Skill\n{self.skill.strip()}"
        return self.system_prompt


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
        known = sorted(x.stem for x in SPEC_DIR.glob("*.yaml"))
        raise HarnessError(f"harness {str(name_or_path)!r}: no file {p}; shipped harnesses: {known}")
    data = load_mapping(p, HarnessError)
    try:
        return HarnessSpec.model_validate(data)
    except ValidationError as e:
        raise HarnessError(describe(p, e)) from None
