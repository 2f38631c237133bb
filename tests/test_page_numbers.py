"""An experiment page cites only numbers a row holds (issue 50, part 5).

Every decimal number in the prose of ``docs/experiments/*.md`` (``0.183``, ``+0.067``,
``-0.10``) must be held by a table of the repository, at the precision the page prints it
(``0.183`` is held by 0.1834, not by 0.1846). The rule, as :func:`unsupported` applies it:

- **What is read.** The page without its fenced code blocks (commands, included configs), its
  inline code spans, its link targets and its HTML comments. A number is a decimal with digits on
  both sides of the point, with an optional sign; integers (counts, seconds, dates, sizes, seeds)
  are not checked, nor is a number written right after ``arXiv`` (a paper's identifier).
- **An interval** ``E [L, H]`` (or ``[L, H]`` alone) is held when one row (a JSON object at any
  depth of a table) holds all of its numbers: an estimate and its interval come from the same row.
- **Any other number** is held by:
  a value of a findings row (``benchmarks/results/findings*.jsonl``) whose ``config`` is a config
  the page names (``configs/<name>.yaml``), or whose ``run`` is a run of one (``<name>-<hash>``);
  a value of a table the page names (``benchmarks/results/<table>.jsonl``);
  a share of two counts of one row object (:data:`SHARES`: ``solved / graded``, a pass rate that
  a step table holds as its counts);
  a value of a config the page names, or its negative (a margin, a learning rate, a temperature;
  ``[-0.10, +0.10]`` around a margin of 0.1);
  or a number as ``docs/methods/*.md`` prints it (the papers' own numbers, which those pages quote).

What the rule cannot do: it checks that some row of a table the page names holds the number at
the printed precision, not that it is the row the sentence means; a table of many values holds
many 3-digit numbers by chance. Intervals, checked as whole triples, are held far less by chance.

A number no table holds is a claim the page makes on its own: take it out, or publish the table
that holds it. The rule never asks to delete a number a row holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "experiments").glob("*.md"))
RESULTS = ROOT / "benchmarks" / "results"

SIGN = r"[+\-\u2212]?"
NUM = rf"{SIGN}\d+\.\d+"
# a number: not inside a word, a path, a version or a longer number
NUMBER = re.compile(rf"(?<![\w.+\-\u2212/])({NUM})(?![\w.]*\d)")
INTERVAL = re.compile(rf"(?:({NUM})\s*)?\[\s*({NUM})\s*,\s*({NUM})\s*\]")
# (numerator, denominator) keys of one row object whose quotient a page may print
SHARES = (("solved", "graded"),)


def prose(text: str) -> str:
    """``text`` without fenced code blocks, inline code, link targets and HTML comments (each
    replaced by a space, so the line numbers of what is left stay those of the page)."""
    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    for pat in (r"```.*?```", r"<!--.*?-->", r"`[^`\n]*`", r"\]\([^)\n]*\)"):
        text = re.sub(pat, blank, text, flags=re.S)
    return text


def value(token: str) -> tuple[float, float]:
    """A printed number as ``(value, half a unit of its last digit)``: ``"+0.067"`` ->
    ``(0.067, 0.0005)``."""
    t = token.replace("\u2212", "-")
    return float(t), 0.5 * 10.0 ** -len(t.split(".")[1]) + 1e-12


def numbers_of(x: Any) -> Iterator[float]:
    """Every number (not bool) in a JSON value, at any depth."""
    if isinstance(x, bool) or x is None:
        return
    if isinstance(x, (int, float)):
        yield float(x)
    elif isinstance(x, dict):
        for v in x.values():
            yield from numbers_of(v)
    elif isinstance(x, list):
        for v in x:
            yield from numbers_of(v)


def objects_of(x: Any) -> Iterator[list[float]]:
    """The numbers directly in each JSON object of ``x`` (an object's own values, a nested
    object's separately, and its :data:`SHARES`), at any depth."""
    if isinstance(x, dict):
        own = [float(v) for v in x.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        yield own + [x[a] / x[b] for a, b in SHARES if isinstance(x.get(a), int) and isinstance(x.get(b), int)
                     and x[b] > 0]
        for v in x.values():
            yield from objects_of(v)
    elif isinstance(x, list):
        for v in x:
            yield from objects_of(v)


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def tables_of(page: str) -> tuple[list[dict[str, Any]], set[float]]:
    """The rows a page may cite (findings rows of the configs it names, every row of the result
    tables it names) and the numeric values of the configs it names."""
    configs = sorted(set(re.findall(r"configs/([A-Za-z0-9_.-]+)\.yaml", page)))
    named = sorted(set(re.findall(r"benchmarks/results/([A-Za-z0-9_]+)\.jsonl", page)))
    held: list[dict[str, Any]] = []
    for f in sorted(RESULTS.glob("findings*.jsonl")):
        held += [r for r in rows(f) if any(str(r.get("config", "")) == f"configs/{c}.yaml"
                                           or str(r.get("run", "")).rsplit("-", 1)[0] == c for c in configs)]
    for name in named:
        if not name.startswith("findings"):
            held += rows(RESULTS / f"{name}.jsonl")
    values: set[float] = set()
    for c in configs:
        p = ROOT / "configs" / f"{c}.yaml"
        if p.is_file():
            values |= set(numbers_of(yaml.safe_load(p.read_text())))
    return held, values


def methods_numbers() -> set[str]:
    """Every decimal number as the methods pages print it (the papers' numbers)."""
    text = " ".join(p.read_text() for p in sorted((ROOT / "docs" / "methods").glob("*.md")))
    return {m.lstrip("+-\u2212") for m in re.findall(NUM, text)}


def _near(x: float, tol: float, pool: list[float]) -> bool:
    return any(abs(v - x) <= tol for v in pool)


def unsupported(page_path: Path) -> list[str]:
    """``"<page>:<line>: <number>"`` for each number of the page's prose that no table holds (the
    module docstring's rule)."""
    raw = page_path.read_text()
    held, config_values = tables_of(raw)
    objs = [o for r in held for o in objects_of(r)]
    flat = [v for o in objs for v in o]
    signed = sorted(config_values | {-v for v in config_values})
    objs.append(signed)  # an interval of config values: [-margin, +margin]
    quoted = methods_numbers()
    out = []
    for ln, line in enumerate(prose(raw).splitlines(), start=1):
        spans = []
        for m in INTERVAL.finditer(line):
            spans.append(m.span())
            parts = [value(t) for t in m.groups() if t]
            if not any(all(_near(x, tol, o) for x, tol in parts) for o in objs):
                out.append(f"{page_path.name}:{ln}: {m.group(0).strip()}")
        for m in NUMBER.finditer(line):
            if any(a <= m.start() < b for a, b in spans) or re.search(r"arXiv[\s:]*$", line[:m.start()]):
                continue
            x, tol = value(m.group(1))
            if _near(x, tol, flat) or _near(x, 1e-12, signed) or m.group(1).lstrip("+-\u2212") in quoted:
                continue
            out.append(f"{page_path.name}:{ln}: {m.group(1)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_number_an_experiment_page_cites_is_held_by_a_row(page):
    bad = unsupported(page)
    assert not bad, "numbers no table holds (tests/test_page_numbers.py says what counts):\n" + "\n".join(bad)


def test_the_rule_catches_an_unsupported_number_and_an_interval_from_two_rows(tmp_path):
    page = tmp_path / "p.md"
    base = ("Run `configs/p6-findings.yaml`.\n\n```bash\necho 0.999\n```\n\n"
            "The rerun: +0.067 [-0.075, +0.208] (arXiv 2507.18071), margin 0.05.\n")
    page.write_text(base)
    assert unsupported(page) == []  # the row's triple, a config value, code and an arXiv id
    page.write_text(base + "A claim no row makes: 0.4321.\n")
    assert unsupported(page) == ["p.md:8: 0.4321"]
    # the first run's estimate with the rerun's interval: each number is in a row, not together
    page.write_text(base + "Mixed: +0.183 [-0.075, +0.208].\n")
    assert unsupported(page) == ["p.md:8: +0.183 [-0.075, +0.208]"]
    # a row of a config the page does not name does not hold its numbers (P4's spread interval)
    page.write_text(base + "Spread [-0.250, -0.084].\n")
    assert unsupported(page) == ["p.md:8: [-0.250, -0.084]"]
    page.write_text(base.replace("Run", "Run `configs/p4-findings.yaml` and") + "Spread [-0.250, -0.084].\n")
    assert unsupported(page) == []
    # a pass rate held as counts (P6's base: 21 of 120 solved), and a margin's +/- band
    page.write_text(base + "Base 0.175, equivalence [-0.05, +0.05].\n")
    assert unsupported(page) == []
