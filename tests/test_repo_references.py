"""Every file the repository cites is in the repository: a path under one of its top-level folders
(``docs/methods/p5-kl.md``, ``tasks/rollout/runner.py``, ``configs/p4-small.yaml``) or a bare
upper-case document name (``README.md``) in any tracked .py, .md or .yaml file must exist, so a
reader of a clone can follow every reference (the code once cited a ``METHODS.md`` it did not
contain).

A docs page that ``scripts/gen_docs.py`` generates on every build (``docs/findings.md``) counts as
present. Not checked: the Terminal-Bench task data (``tasks/records/suites/terminal/``, and the
shipped test tasks under ``tests/records/fixtures/``), whose paths
name files inside a task's sandbox (``docs/keep.md`` there is a file the task creates); the
``tests/...`` paths of :data:`TASK_FOLDER_FILES`, which name files of a Terminal-Bench task folder
(``tests/test_outputs.py``), not of this repository; and :data:`SANDBOX_NAMES`, file names an
episode's sandbox holds. This file itself is not scanned: its examples cite missing files.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402

GENERATED = {f"docs/{page}" for page in gen_docs.PAGES}
SUFFIXES = (".py", ".md", ".yaml", ".yml")
# the task data, and this file (its examples cite missing files on purpose)
EXCLUDED = ("tasks/records/suites/terminal/", "tests/records/fixtures/", "tests/test_repo_references.py")
# the skill file a harness may write into the episode's work dir (harness spec ``skill_path``)
SANDBOX_NAMES = {"SKILL.md"}
# files that describe Terminal-Bench task folders: their tests/... paths are inside a task folder
TASK_FOLDER_FILES = {"tasks/records/suites/terminal_bench.py", "tests/records/test_terminal_bench.py",
                     "tests/records/test_p6_reward.py", "tests/records/test_terminal_generator.py"}
_EXT = r"(?:md|py|yaml|yml|sh|toml|json|txt|cfg)"


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def _patterns(files: list[str]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    tops = sorted({f.split("/")[0] for f in files if "/" in f})
    under = re.compile(r"(?<![\w/.$~-])((?:" + "|".join(map(re.escape, tops)) + r")/[\w./-]*[\w-]\." + _EXT
                       + r")(?![\w/])")
    bare = re.compile(r"(?<![\w/.$~-])([A-Z][A-Z0-9_-]*\.md)(?![\w/])")
    return under, bare


def missing_references(files: list[str], read=lambda f: (ROOT / f).read_text(errors="replace"),
                       exists=lambda p: p in GENERATED or (ROOT / p).exists()) -> list[str]:
    """``"<file>:<line>: <path>"`` for each cited path that does not exist, in file order."""
    under, bare = _patterns(files)
    out = []
    for f in files:
        if not f.endswith(SUFFIXES) or f.startswith(EXCLUDED):
            continue
        for n, line in enumerate(read(f).splitlines(), 1):
            cited = [m.group(1) for m in under.finditer(line)
                     if not (f in TASK_FOLDER_FILES and m.group(1).startswith("tests/"))]
            cited += [m.group(1) for m in bare.finditer(line) if m.group(1) not in SANDBOX_NAMES]
            out += [f"{f}:{n}: {p}" for p in cited if not exists(p)]
    return out


def test_every_cited_file_is_in_the_repository():
    files = tracked()
    assert __file__.endswith("tests/test_repo_references.py") and "tests/test_repo_references.py" in files
    assert missing_references(files) == []


def test_a_reference_to_a_missing_file_fails():
    files = ["tasks/a.py", "docs/methods/p5-kl.md", "tasks/records/suites/terminal/t/task.yaml",
             "configs/default.yaml", "tests/records/test_terminal_bench.py"]
    text = {
        "tasks/a.py": '"""See METHODS.md, P5, and docs/methods/p5-kl.md; docs/methods/p9.md is gone."""\n'
                      "# README.md and SKILL.md; /app/docs/x.md is a sandbox path; tasks/a.py itself\n",
        "docs/methods/p5-kl.md": "Run configs/p5.yaml (tasks/<stage>/stage.py is a pattern).\n",
        "tasks/records/suites/terminal/t/task.yaml": "write docs/keep.md\n",
        "configs/default.yaml": "",
        "tests/records/test_terminal_bench.py": "a task's tests/test_outputs.py; tasks/b.py\n",
    }
    present = {"docs/methods/p5-kl.md", "README.md", "tasks/a.py"}
    got = missing_references(files, read=text.__getitem__, exists=present.__contains__)
    assert got == ["tasks/a.py:1: docs/methods/p9.md", "tasks/a.py:1: METHODS.md",
                   "docs/methods/p5-kl.md:1: configs/p5.yaml", "tests/records/test_terminal_bench.py:1: tasks/b.py"]


def test_a_generated_docs_page_counts_as_present():
    assert GENERATED == {"docs/reference/commands.md", "docs/reference/configuration.md",
                         "docs/reference/harness-spec.md", "docs/benchmarks.md", "docs/findings.md"}
    assert missing_references(["README.md"], read=lambda f: "the findings page (docs/findings.md)") == []


# a host's own folders: a clone elsewhere has none of them (``/root/`` is left out: the compose
# file names the container's home, not a host's)
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|Users)/[\w.-]+")


def machine_paths(files: list[str], read=lambda f: (ROOT / f).read_bytes()) -> list[str]:
    """``"<file>:<line>: <path>"`` for each absolute path of one machine's folders in a tracked
    text file (binary files, those with a NUL byte, are skipped)."""
    out = []
    for f in files:
        if f == "tests/test_repo_references.py":
            continue
        data = read(f)
        if b"\0" in data:
            continue
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            out += [f"{f}:{n}: {m.group(0)}" for m in MACHINE_PATH.finditer(line)]
    return out


def test_no_tracked_file_names_a_folder_of_one_machine():
    """Both README commands work in a clone that stands alone: no test, config or doc reaches for
    a path that exists on one machine only."""
    assert machine_paths(tracked()) == []


def test_a_machine_path_is_found():
    files = {"a.py": b'DIR = "/work/shared/data"\n', "b.md": b"see ~/work/x and /root/.cache and ./home/y\n",
             "c.png": b"\0/home/u/x"}
    assert machine_paths(list(files), read=files.__getitem__) == ["a.py:1: /work/shared"]
