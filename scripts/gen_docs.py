"""The docs pages that are generated, never written by hand, so they cannot go stale:

- ``reference/configuration.md``: every section and field of ``tasks.config.RunConfig`` (type,
  default, constraints) with each section's docstring, from the pydantic models;
- ``reference/harness-spec.md``: every field of ``tasks.harnesses.spec.HarnessSpec`` and the
  shipped harnesses (``tasks/harnesses/specs/*.yaml``), loaded and validated;
- ``benchmarks.md``: the rows of ``benchmarks/results/*.jsonl`` (commit, date, machine, figures);
- ``findings.md``: the papers' headlines as tested, from ``benchmarks/results/findings.jsonl``
  (rows that ``harnessrl findings --append`` writes from verified runs).

mkdocs runs this file as a hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds the pages to
the build in memory; nothing is written into ``docs/``. ``python scripts/gen_docs.py OUT_DIR``
writes them to a folder instead, to read them without mkdocs.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: rows of each benchmark shown on the page, newest first
ROWS_SHOWN = 6


def _type_name(tp: Any) -> str:
    """A short readable form of a field's annotation: ``'a' | 'b'`` for a Literal, ``list[str]``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _field_type(field: Any) -> str:
    """:func:`_type_name` of the field's annotation; for a field whose values are a registry's names
    (``tasks.registries.OneOf``), the names registered now, as a Literal would show them."""
    from tasks.registries import OneOf

    one_of = next((m for m in field.metadata if isinstance(m, OneOf)), None)
    return " | ".join(repr(n) for n in one_of.registry) if one_of else _type_name(field.annotation)


def _models_in(tp: Any, in_list: bool = False) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models a field's annotation holds (directly, in a list, or in an Optional),
    each with whether it sits in a list."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(tp, in_list)]
    is_list = in_list or typing.get_origin(tp) is list
    return [m for a in typing.get_args(tp) for m in _models_in(a, is_list)]


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(section defaults)"
        return f"`{json.dumps(value)}`"
    value = field.default
    return f"`{json.dumps(value) if not isinstance(value, str) else repr(value)}`"


def _constraints(field: Any) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "min length"),
                          ("max_length", "max length"), ("pattern", "pattern")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} `{v}`" if attr != "pattern" else f"pattern `{v}`")
    return ", ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _docstring(model: type[BaseModel]) -> str:
    """The model's own docstring, Sphinx roles (``:class:`X` ``) reduced to code spans."""
    if not model.__dict__.get("__doc__"):
        return ""
    return re.sub(r":(?:class|meth|func|mod|attr):`~?([^`]+)`", r"`\1`", inspect.getdoc(model) or "")


def model_sections(model: type[BaseModel], prefix: str, level: int = 2,
                   seen: set[str] | None = None) -> list[str]:
    """Markdown for ``model`` as the section ``prefix`` (a heading, its docstring, a table of its
    fields with dotted names), then one such section per nested model field."""
    seen = set() if seen is None else seen
    lines = [f"{'#' * level} `{prefix}`" if prefix else f"{'#' * level} Top level", ""]
    doc = _docstring(model)
    if doc:
        lines += [doc, ""]
    lines += ["| key | type | default | constraints |", "| --- | --- | --- | --- |"]
    nested = []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        lines.append(f"| `{key}` | {_cell(_field_type(field))} | {_cell(_default(field))} | "
                     f"{_cell(_constraints(field))} |")
        for sub, in_list in _models_in(field.annotation):
            nested.append((f"{key}[]" if in_list else key, sub))
    lines.append("")
    for key, sub in nested:
        lines += model_sections(sub, key, level + (1 if prefix else 0), seen)
    return lines


def config_reference() -> str:
    from tasks.config import RunConfig

    top = [n for n, f in RunConfig.model_fields.items() if _models_in(f.annotation)]
    return "\n".join([
        "# Configuration reference",
        "",
        "Generated from the pydantic models in `tasks/config/` (`scripts/gen_docs.py`, run by mkdocs "
        "on every build). A config file is YAML validated by `RunConfig`; unknown keys are refused. "
        "Override any key on the command line with `--set section.key=value` (YAML value syntax). "
        "Every config under `configs/` starts with a comment describing its experiment; "
        "`configs/default.yaml` is the embedded default.",
        "",
        "Sections: " + ", ".join(f"`{n}`" for n in top) + ".",
        "",
        *model_sections(RunConfig, ""),
    ])


def harness_reference() -> str:
    from tasks.harnesses.spec import HarnessSpec, load_harness, shipped_harnesses

    rows = ["| harness | family | action format | loop | max turns | tools | environments |",
            "| --- | --- | --- | --- | ---: | --- | --- |"]
    for name in shipped_harnesses():
        h = load_harness(name)
        tools = ", ".join(t.name for t in h.tools) or "-"
        rows.append(f"| `{h.name}` | {_cell(h.family)} | `{h.action_format}` | `{h.loop_type}` | {h.max_turns} | "
                    f"{_cell(tools)} | {', '.join(h.environments)} |")
    return "\n".join([
        "# Harness spec reference",
        "",
        "Generated from `tasks/harnesses/spec.py` and `tasks/harnesses/specs/*.yaml` (`scripts/gen_docs.py`). "
        "A harness is one YAML file validated by `HarnessSpec` and hashed into its `harness_id`; one engine "
        "(`tasks/rollout/harness.py`) interprets every spec, so adding a harness is adding a file. "
        "A config names harnesses by file name (`harnesses: [direct, react-python]`) or by path.",
        "",
        "## Shipped harnesses",
        "",
        *rows,
        "",
        *model_sections(HarnessSpec, "", 2),
        *application_sections(),
    ])


def application_sections() -> list[str]:
    """The harness-spec section of each application's loop type (its ``harness_block``), from the
    application registry: present only in a spec of that loop type."""
    from tasks.registries.applications import applications

    out: list[str] = []
    for app in applications():
        if app.harness_block and app.harness_block_model is not None:
            out += [f"Loop type `{app.loop_type}` ({app.title or app.name}) needs the `{app.harness_block}` section "
                    "below; no other spec may have it.", ""]
            out += model_sections(app.harness_block_model, app.harness_block, 2)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        s = json.dumps(v, separators=(", ", ": "))
        return s if len(s) <= 120 else s[:117] + "..."
    return str(v)


def _script_summary(name: str) -> str:
    """The first paragraph of ``benchmarks/<name>.py``'s docstring, on one line."""
    script = ROOT / "benchmarks" / f"{name}.py"
    if not script.is_file():
        return ""
    import ast

    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


#: a row's dict-valued fields shown as one cell, not one line per key: the withdrawn figures and why
_UNNESTED = frozenset({"withdrawn"})


def benchmarks_page(results: Path = RESULTS, scripts: Path = ROOT / "benchmarks") -> str:
    """One section per script under ``benchmarks/`` (what it measures: its docstring's first
    paragraph), then the newest rows of ``results/<name>.jsonl`` as columns, one figure a line (a
    block such as ``machine`` or ``same_sampler``: one line per key, ``block.key``). A row's
    ``withdrawn`` (figure -> why) replaces those figures' cells by "withdrawn": a figure found not
    to hold stays in the file, with the reason, but the page does not state it."""
    lines = [
        "# Benchmarks",
        "",
        "Generated from the scripts under `benchmarks/` and their tracked rows in `benchmarks/results/*.jsonl` "
        "(`scripts/gen_docs.py`). Each row is one run of a script, stamped with the commit (`+dirty`: with "
        "uncommitted changes), the date (UTC) and the machine. Add a row by running a script at its full "
        "sizes; the page follows on the next docs build. Every script also has `--smoke` (tiny sizes, "
        "seconds), which the test suite runs into a temporary folder, so a script that stops working fails "
        "the tests; smoke rows show that a script runs, not how fast anything is.",
        "",
        "```bash",
        ".venv/bin/python benchmarks/artifact_store.py --smoke   # seconds",
        ".venv/bin/python benchmarks/artifact_store.py           # full sizes, one row",
        "```",
        "",
    ]
    names = sorted(({p.stem for p in scripts.glob("*.py") if not p.stem.startswith("_")} |
                    ({p.stem for p in results.glob("*.jsonl")} if results.is_dir() else set())) - {"findings"})
    for name in names:
        lines += [f"## {name}", ""]
        summary = _script_summary(name)
        if summary:
            lines += [summary, ""]
        f = results / f"{name}.jsonl"
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
        if not rows:
            lines += [f"No rows recorded yet: run `.venv/bin/python benchmarks/{name}.py`.", ""]
            continue
        shown = rows[::-1][:ROWS_SHOWN]
        lines += [f"{len(rows)} row(s) in `benchmarks/results/{f.name}`; the newest {len(shown)} shown.", ""]
        keys: list[str] = []
        for r in shown:
            for k, v in r.items():
                if isinstance(v, dict) and k not in _UNNESTED:  # a block (machine, same_sampler): one line a figure
                    for mk in v:
                        if f"{k}.{mk}" not in keys:
                            keys.append(f"{k}.{mk}")
                elif k not in keys:
                    keys.append(k)
        lines += ["| figure | " + " | ".join(f"run {i + 1}" for i in range(len(shown))) + " |",
                  "| --- | " + " | ".join("---" for _ in shown) + " |"]
        for k in keys:
            vals = []
            for r in shown:
                block, _, sub = k.partition(".")
                v = r.get(k) if k in r or not sub else (r.get(block) or {}).get(sub)
                if k == "commit" and isinstance(v, str):
                    v = v[:12] + ("+dirty" if v.endswith("+dirty") else "")
                if k in (r.get("withdrawn") or {}):  # a figure the row itself withdraws: not shown as a number
                    vals.append("withdrawn (see `withdrawn`)")
                    continue
                vals.append("" if v is None else _cell(_fmt(v)))
            lines.append(f"| `{k}` | " + " | ".join(vals) + " |")
        lines.append("")
    return "\n".join(lines)


def _steps_table(arms: list[dict]) -> list[str]:
    """P6's table on the findings page (lines; none when no arm row carries ``steps``): per
    checkpoint (the base, then each arm) and evaluation harness, the median (mean) agent steps of
    the solved and of the failed sealed attempts, and how the failed ones ended, as counts out of
    the failed; n/a where the run's ``analyze/step_failures`` could not say (its note)."""
    if not any(a.get("steps") for a in arms):
        return []
    rows = [("base", s) for s in arms[0].get("base_steps", [])] + [(a["arm"], s) for a in arms for s in a["steps"]]

    def n(v: Any) -> str:
        return "n/a" if v is None else f"{v:g}"

    def mm(med: Any, mean: Any) -> str:
        return "n/a" if med is None else f"{med:g} ({mean:.2f})"

    out = ["Agent steps (turns) of the sealed attempts, solved and failed apart, median (mean), and how the failed "
           "attempts ended (counts of the failed: wrong answer, turn limit, token limit, no answer, timeout), with "
           "the attempts that had a tool error (`analyze/step_failures`, P6).", "",
           "| checkpoint | harness | solved / graded | steps solved | steps failed | wrong answer | turn limit "
           "| token limit | no answer | timeout | tool errors |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for ck, s in rows:
        out.append("| " + " | ".join(_cell(str(x)) for x in [
            ck, s["harness"], f"{s['solved']} / {s['graded']}", mm(s["median_turns_solved"], s["mean_turns_solved"]),
            mm(s["median_turns_failed"], s["mean_turns_failed"]), n(s["failed_submitted"]), n(s["failed_max_turns"]),
            n(s["failed_max_tokens"]), n(s["failed_format_error"]), n(s["failed_timeout"]),
            n(s["tool_error_attempts"])]) + " |")
    notes = [f"{ck} / {s['harness']}: {s['note']}" for ck, s in rows if s.get("note")]
    return out + [""] + ([f"- {_cell(x)}" for x in notes] + [""] if notes else [])


def _yes_no(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "no")


def _infra_cell(row: dict) -> str:
    """A findings row's infra errors: ``0 of N`` (N: every stage's denominator summed) when none,
    else ``stage n/planned`` for each stage that had some; ``not recorded`` for a row published
    before rows carried ``infra_errors``."""
    errs = row.get("infra_errors")
    if errs is None:
        return "not recorded"
    planned = row.get("infra_planned") or {}
    if not any(errs.values()):
        return f"0 of {sum(planned.values())}" if planned else "0 (no stage that can lose one)"
    return ", ".join(f"{s} {n}/{planned.get(s, '?')}" for s, n in errs.items() if n)


def _control_cell(row: dict) -> str:
    """A findings row's control: its estimate, with its interval where the row carries one (rule
    2; ``n/a`` when the control had none); empty where the finding names no control."""
    if row.get("control") is None:
        return ""
    if "control_ci_low" not in row:
        return f"{row['control']:+.3f}"
    lo, hi = row["control_ci_low"], row["control_ci_high"]
    return f"{row['control']:+.3f} " + ("[n/a]" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]")


def _seeds_cell(row: dict) -> str:
    """Each trained arm of a findings row with its training seeds (``gspo 3, grpo 3``); ``none``
    for a finding over untrained checkpoints only; a BiPA row's skill-optimizer seeds
    (``optimizer 3``; ``none`` for a claim about the hand-written pool); ``not recorded`` for a row published before
    rows carried ``seeds``."""
    seeds = row.get("seeds")
    if seeds is None and "optimizer_seeds" in row:  # a BiPA row: skill-optimizer runs, nothing trained
        return f"optimizer {row['optimizer_seeds']}" if row["optimizer_seeds"] else "none"
    if seeds is None:
        return "not recorded"
    return ", ".join(f"{arm} {n}" for arm, n in seeds.items()) or "none"


def findings_page(results: Path = RESULTS, figures: Path = ROOT / "docs" / "img" / "findings") -> str:
    """The findings table: one row per tested headline, newest first, from ``findings.jsonl``."""
    f = results / "findings.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    lines = [
        "# Findings",
        "",
        "Generated from `benchmarks/results/findings.jsonl` (`scripts/gen_docs.py`). Each row is one paper's "
        "headline as a run of this repository tested it: the measure's estimate with its Bonferroni interval, "
        "the number of held-out tasks, the random-reward control's estimate where the claim is a learning "
        "claim, and the verdict by the rule fixed before the run ([how verdicts are decided](experiments/"
        "findings-rules.md)). A row is written only from a run that `harnessrl verify` accepts, and "
        "`harnessrl verify RUN --findings benchmarks/results/findings.jsonl` recomputes its numbers; a verdict "
        "marked *not sealed* comes from a run without a signed hash chain (a `harnessrl talkmesh` run made "
        "before those runs were sealed), whose numbers no `harnessrl verify` can recompute; a verdict marked "
        "*fallback-graded* comes from a run whose harnesses all read the last number of a reply the policy had "
        "not written in their format, so its harnesses differed in wording only "
        "([P1 and P4](experiments/p1-p4.md#the-published-p1-and-p4-rows-were-graded-by-the-last-number-fallback)).",
        "",
        "```bash",
        ".venv/bin/harnessrl run -c configs/p4-findings.yaml          # about the time in the wall column",
        ".venv/bin/harnessrl findings -c configs/p4-findings.yaml --append benchmarks/results/findings.jsonl",
        "```",
        "",
    ]
    if not rows:
        return "\n".join(lines + ["No findings recorded yet: no findings config has been run to the end and "
                                   "published. Until one is, this page has no numbers.", ""])
    lines += ["An infra error is an attempt the infrastructure lost (a sandbox that did not start); the *infra "
              "errors* column counts them per stage of the run (rollout, online training, the evaluation's final "
              "attempts: [the threshold](experiments/findings-rules.md#infra-errors)); *not recorded*: a row "
              "published before rows carried the count.", "",
              "The *control* column is the random-reward control's estimate and, in rows decided by [rule 2]"
              "(experiments/findings-rules.md#the-verdict-rule), its interval; *seeds* counts each trained arm's "
              "training runs (*not recorded*: a row published before rows carried them, each arm trained once); a "
              "verdict marked *single seed* is a recipe comparison with an arm trained once, which rule 2 never "
              "calls reproduced.", "",
              "| paper | headline | measure | estimate | interval | n | control | seeds | verdict | config | commit "
              "| wall (s) | infra errors |",
              "| --- | --- | --- | ---: | --- | ---: | ---: | --- | --- | --- | --- | ---: | --- |"]
    for r in rows[::-1]:
        iv = "n/a" if r.get("ci_low") is None else f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
        lines.append("| " + " | ".join(_cell(str(x)) for x in [
            r["paper"], r["headline"], r["measure"], "n/a" if r.get("estimate") is None else f"{r['estimate']:+.3f}",
            iv, r["n"], _control_cell(r), _seeds_cell(r), f"**{r['verdict']}**"
            + (" (not sealed)" if r.get("sealed") is False else "")
            + (" (fallback-graded)" if r.get("grading") == "last_number_fallback" else "")
            + (" (single seed)" if r.get("single_seed") else ""),
            f"`{r['config']}`", f"`{str(r['commit'])[:12]}`", "" if r.get("wall_s") is None else f"{r['wall_s']:.0f}",
            _infra_cell(r),
        ]) + " |")
    af = results / "findings_arms.jsonl"
    arms: dict[str, list[dict]] = {}
    for x in (af.read_text().splitlines() if af.is_file() else []):
        if x.strip():
            a = json.loads(x)
            arms.setdefault(a["run"], []).append(a)
    runs = sorted({p.name.split("--")[0] for p in figures.glob("*--*.png")} | set(arms)) if figures.is_dir() \
        else sorted(arms)
    for run in runs:
        lines += [f"## `{run}`", ""]
        latest: dict[str, dict] = {}
        for a in arms.get(run, []):  # a run published twice: its last rows
            latest[a["arm"]] = a
        if latest:
            lines += ["Training arms: the KL configuration's gradient bias by exact enumeration (`harnessrl kl-check`), "
                      "stability by the [pre-registered rule](experiments/findings-rules.md#training-stability-p5), "
                      "the mean training reward over the first and last steps of the stability window, and sealed "
                      "held-out pass@1 per (harness, suite) with its 95% task-bootstrap interval.", "",
                      "| arm | KL | beta | staleness | control | unbiased | rel. bias | stable | reward early -> late "
                      "| pass@1 [95% interval] |",
                      "| --- | --- | ---: | ---: | --- | --- | ---: | --- | --- | --- |"]
            for a in latest.values():
                rates = "; ".join(f"{r['harness']} {r['suite'].split('/')[-1]}: " + (
                    "n/a" if r["pass_at_1"] is None else f"{r['pass_at_1']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
                    for r in a["pass_at_1"])
                rw = "n/a" if a.get("early_reward") is None else f"{a['early_reward']:.3f} -> {a['late_reward']:.3f}"
                lines.append("| " + " | ".join(_cell(str(x)) for x in [
                    a["arm"], a["kl_config"] or "none", f"{a['beta']:g}", a["max_staleness"],
                    a.get("reward_control") or "none", _yes_no(a["unbiased"]),
                    "n/a" if a["relative_bias"] is None else f"{a['relative_bias']:.3f}",
                    _yes_no(a["stable"]) + (f" ({a['reason']})" if a.get("reason") else ""), rw, rates]) + " |")
            lines.append("")
            lines += _steps_table(list(latest.values()))
        for p in sorted(figures.glob(f"{run}--*.png")) if figures.is_dir() else []:
            lines += [f"![{p.stem.split('--')[1]} of {run}](img/findings/{p.name})", ""]
    return "\n".join(lines + [""])


def commands_reference() -> str:
    """Every ``harnessrl`` command with its help text and parameters, from the typer app."""
    import typer.main

    from flows.cli import app

    group = typer.main.get_command(app)
    lines = ["# Commands", "",
             "Generated from the command-line app `flows/cli.py` (`scripts/gen_docs.py`). Run them as "
             "`.venv/bin/harnessrl COMMAND` (or activate the environment: `. .venv/bin/activate`); "
             "`harnessrl COMMAND --help` prints the same.", ""]
    for name, cmd in group.commands.items():
        lines += [f"## `harnessrl {name}`", "", inspect.cleandoc(cmd.help or ""), "",
                  "| parameter | help | default |", "| --- | --- | --- |"]
        for prm in cmd.params:
            if prm.name == "help":
                continue
            label = ", ".join(prm.opts) if prm.opts[0].startswith("-") else prm.name.upper()
            default = prm.default
            if isinstance(default, Path) and default.is_absolute():
                default = default.relative_to(ROOT) if default.is_relative_to(ROOT) else default
            shown = "" if default in (None, [], ()) or callable(default) else f"`{default}`"
            lines.append(f"| `{label}` | {_cell(getattr(prm, 'help', None) or '')} | {_cell(shown)} |")
        lines.append("")
    return "\n".join(lines)


PAGES = {
    "reference/commands.md": commands_reference,
    "reference/configuration.md": config_reference,
    "reference/harness-spec.md": harness_reference,
    "benchmarks.md": benchmarks_page,
    "findings.md": findings_page,
}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the build (in memory)."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files


def main(argv: list[str] | None = None) -> None:
    out = Path((argv or sys.argv[1:] or ["site-gen"])[0])
    for path, make in PAGES.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
        print(target)


if __name__ == "__main__":
    main()
