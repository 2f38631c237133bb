"""The tool implementations a harness spec can bind its tools to.

A harness names its tools as its family does (SWE-agent's ``view``, Qwen Code's ``read_file``,
OpenHands' ``finish``) and binds each to one implementation here with ``impl``; ``arguments``
maps the implementation's parameter names to the names in the harness's JSON schema. Adding a
harness never needs new code unless it needs a new *kind* of action.

Workspace tools act on the episode's sandbox (paths relative to the work dir ``/app``); browser
tools act on the episode's browser session. Every tool returns a :class:`ToolOutput`; a bad
argument (a missing file, a search string that does not occur) is the agent's mistake and comes
back as text in the observation: either the tool returns it, or it raises SandboxPathError /
OSError, which the engine turns into the tool's error text. Only infrastructure failures end the
episode (:class:`tasks.environments.errors.SandboxError`, :class:`tasks.environments.errors.BrowserError`).
"""

from __future__ import annotations

import ast
import fnmatch
import math
import operator
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from tasks.environments.errors import SandboxPathError

Needs = Literal["sandbox", "browser", "none"]


class ToolEnv(Protocol):
    """What a tool may act on: the episode's sandbox (created on first use) or browser."""

    def sandbox(self) -> Any: ...

    def browser_session(self) -> Any: ...


@dataclass(frozen=True)
class ToolOutput:
    """A tool's result: ``text`` for the observation; ``files_read`` (work-dir paths whose content
    entered the context, for read spans); ``submitted`` True when the tool ends the episode, with
    ``answer`` (may be None); ``status`` and ``exit_code`` the sandbox's exec status and exit status
    when the tool ran a command (``exit_code`` None otherwise, or when the sandbox killed it)."""

    text: str
    files_read: tuple[str, ...] = ()
    submitted: bool = False
    answer: str | None = None
    status: str = "ok"  # the sandbox's exec status when the tool ran a command
    exit_code: int | None = None


@dataclass(frozen=True)
class ToolImpl:
    """One implementation: ``params`` required, ``optional`` optional parameter names; ``needs``
    what it acts on; ``run(env, args, timeout_s)``."""

    name: str
    params: tuple[str, ...]
    optional: tuple[str, ...]
    needs: Needs
    run: Callable[[ToolEnv, dict[str, Any], float], ToolOutput]
    doc: str = ""
    tags: tuple[str, ...] = field(default=())


def _safe_path(path: Any) -> str:
    """A work-dir-relative path; ``/app/x`` is accepted as ``x``.

    Raises:
        SandboxPathError: a path outside ``/app`` or escaping it with ``..`` (the engine shows
            the message to the agent as the tool's result).
    """
    p = str(path).strip()
    if p.startswith("/app/"):
        p = p[len("/app/"):]
    elif p == "/app":
        p = "."
    if p.startswith("/"):
        raise SandboxPathError(f"path {path!r} is outside the work dir /app")
    norm = posixpath.normpath(p)
    if norm == ".." or norm.startswith("../"):
        raise SandboxPathError(f"path {path!r} escapes the work dir /app")
    return norm


def _exec_text(res: Any) -> str:
    out = res.combined_output().strip()
    if res.status not in ("ok",) and not out:
        out = f"[exit status {res.exit_code}, {res.status}]"
    elif res.status not in ("ok", "error"):
        out += f"\n[{res.status}]"
    return out or "(no output)"


def _python(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    sbx = env.sandbox()
    sbx.write_file(".harness/main.py", str(args["code"]))
    res = sbx.exec(["python3", "-I", ".harness/main.py"], timeout_s=timeout_s)
    return ToolOutput(_exec_text(res), status=res.status, exit_code=res.exit_code)


def _shell(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    res = env.sandbox().exec(["bash", "-c", str(args["command"])], timeout_s=timeout_s)
    return ToolOutput(_exec_text(res), status=res.status, exit_code=res.exit_code)


def _read(env: ToolEnv, path: str) -> str | None:
    """The file's text, or None when it does not exist (other refusals propagate to the engine,
    which shows them to the agent)."""
    try:
        return env.sandbox().read_file(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _read_file(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    path = _safe_path(args["path"])
    text = _read(env, path)
    if text is None:
        return ToolOutput(f"Error: no file {args['path']!r}")
    lines = text.splitlines()
    start = int(args.get("start_line") or 1)
    end = int(args.get("end_line") or len(lines))
    start, end = max(1, start), min(len(lines), end)
    body = "\n".join(f"{i:>4}| {lines[i - 1]}" for i in range(start, end + 1))
    return ToolOutput(f"{path} (lines {start}-{end} of {len(lines)}):\n{body}" if lines else f"{path} is empty",
                      files_read=(path,))


def _write_file(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    path = _safe_path(args["path"])
    content = str(args["content"])
    env.sandbox().write_file(path, content)
    return ToolOutput(f"Wrote {len(content.encode())} bytes to {path}")


def _str_replace(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    path = _safe_path(args["path"])
    text = _read(env, path)
    if text is None:
        return ToolOutput(f"Error: no file {args['path']!r}")
    out = apply_replace(text, str(args["old"]), str(args["new"]))
    if isinstance(out, str) and out.startswith("Error:"):
        return ToolOutput(out)
    env.sandbox().write_file(path, out[1])
    return ToolOutput(f"Edited {path}: replaced 1 occurrence ({out[0]} lines changed)")


def apply_replace(text: str, old: str, new: str) -> str | tuple[int, str]:
    """Replace the single occurrence of ``old`` in ``text``. Returns ``(lines changed, new text)``
    or an ``"Error: ..."`` message when ``old`` is empty, absent or not unique."""
    if not old:
        return "Error: the text to replace is empty"
    n = text.count(old)
    if n == 0:
        return "Error: the text to replace does not occur in the file"
    if n > 1:
        return f"Error: the text to replace occurs {n} times; give more context to make it unique"
    return max(old.count("\n"), new.count("\n")) + 1, text.replace(old, new, 1)


def _search(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    path = _safe_path(args.get("path") or ".")
    cmd = f"grep -rnE --binary-files=without-match -e {shlex.quote(str(args['pattern']))} -- {shlex.quote(path)} | head -n 50"
    res = env.sandbox().exec(["bash", "-c", cmd], timeout_s=timeout_s)
    return ToolOutput(res.stdout.strip() or "No matches.", status=res.status, exit_code=res.exit_code)


def _glob(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    res = env.sandbox().exec(["bash", "-c", "find . -type f -not -path './.harness/*' | sed 's|^\\./||' | sort | head -n 2000"],
                             timeout_s=timeout_s)
    pattern = str(args["pattern"])
    hits = [p for p in res.stdout.splitlines() if fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, f"*/{pattern}")]
    return ToolOutput("\n".join(hits[:200]) or "No files match.", status=res.status, exit_code=res.exit_code)


def _list_dir(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    path = _safe_path(args.get("path") or ".")
    res = env.sandbox().exec(["ls", "-la", "--", path], timeout_s=timeout_s)
    return ToolOutput(_exec_text(res), status=res.status, exit_code=res.exit_code)


def _submit(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    ans = args.get("answer")
    return ToolOutput("Submitted.", submitted=True, answer=None if ans is None else str(ans).strip())


def _click(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    return ToolOutput(env.browser_session().click(str(args["ref"])))


def _type(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    return ToolOutput(env.browser_session().type(str(args["ref"]), str(args["text"])))


_ARITH_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_CALC_MAX_CHARS = 200       # a longer expression is refused, not parsed
_CALC_MAX_MAGNITUDE = 1e15  # any intermediate result beyond this is refused (no 9**9**9 bombs)


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, ``+ - * / // % **`` and parentheses only.

    Parsed with :func:`ast.parse` and walked node by node: no name, call, attribute or any other
    Python construct is ever evaluated, so this is a calculator, not a code runner (it needs no
    sandbox). An exponent above 64, an intermediate magnitude above 1e15 and an expression longer
    than 200 characters are refused.

    Returns an ``int`` when every operand and result is whole, else a ``float``.

    Raises:
        ValueError: the expression is not pure arithmetic, divides by zero or exceeds a limit;
            the message is shown to the agent as the tool's output.
    """
    expr = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if len(expr) > _CALC_MAX_CHARS:
        raise ValueError(f"expression longer than {_CALC_MAX_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            v = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH_OPS:
            v = _ARITH_OPS[type(node.op)](walk(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > 64:
                raise ValueError("exponent above 64")
            try:
                v = _ARITH_OPS[type(node.op)](a, b)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
        else:
            raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")
        if isinstance(v, complex) or not math.isfinite(v) or abs(v) > _CALC_MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return v

    v = walk(tree.body)
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _calculate(env: ToolEnv, args: dict[str, Any], timeout_s: float) -> ToolOutput:
    try:
        v = evaluate_arithmetic(str(args["expression"]))
    except ValueError as e:
        return ToolOutput(f"error: {e}", status="error")
    return ToolOutput(str(round(v, 10) if isinstance(v, float) else v))


IMPLS: dict[str, ToolImpl] = {t.name: t for t in [
    ToolImpl("python", ("code",), (), "sandbox", _python, "run a Python 3 program; stdout and stderr come back"),
    ToolImpl("shell", ("command",), (), "sandbox", _shell, "run a bash command in /app"),
    ToolImpl("read_file", ("path",), ("start_line", "end_line"), "sandbox", _read_file, "show a file with line numbers"),
    ToolImpl("write_file", ("path", "content"), (), "sandbox", _write_file, "create or overwrite a file"),
    ToolImpl("str_replace", ("path", "old", "new"), (), "sandbox", _str_replace, "replace one unique string in a file"),
    ToolImpl("search", ("pattern",), ("path",), "sandbox", _search, "grep -rnE a regex under a path"),
    ToolImpl("glob", ("pattern",), (), "sandbox", _glob, "list files matching a glob pattern"),
    ToolImpl("list_dir", (), ("path",), "sandbox", _list_dir, "list a directory"),
    ToolImpl("calculate", ("expression",), (), "none", _calculate, "evaluate an arithmetic expression"),
    ToolImpl("submit", (), ("answer",), "none", _submit, "end the episode, optionally with an answer"),
    ToolImpl("click", ("ref",), (), "browser", _click, "click the page element with this reference"),
    ToolImpl("type", ("ref", "text"), (), "browser", _type, "type text into the page element with this reference"),
]}
