"""The built-in Terminal-Bench task folders (tasks/records/suites/terminal/) and their generator
(generate.py there) cannot drift: the generator, run into a temporary folder, writes exactly the
committed files, byte for byte, and nothing else; each committed fail-to-pass / pass-to-pass list
(harnessrl-tests.json, which the generator computes in bwrap sandboxes and this test does not) is
keyed to the tests, oracle and workspace it was computed for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tasks.records.suites.terminal_bench import BUILTIN, BUILTIN_DIR, LISTS_FILE, task_from_folder

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = BUILTIN_DIR / "generate.py"
NOT_TASKS = {"generate.py", "README.md", ".gitattributes"}  # the folder's own files, not written by it


def committed() -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z", "."], cwd=BUILTIN_DIR, capture_output=True, check=True).stdout
    return {f for f in out.decode().split("\0") if f} - NOT_TASKS


def generated_into(out: Path) -> set[str]:
    subprocess.run([sys.executable, str(GENERATOR), str(out), "--no-lists"], cwd=out, check=True, timeout=120,
                   capture_output=True)
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> tuple[Path, set[str]]:
    out = tmp_path_factory.mktemp("terminal")
    return out, generated_into(out)


def differing(out: Path, base: Path, files: set[str]) -> list[str]:
    """The files of ``files`` whose bytes under ``base`` differ from the generator's under ``out``."""
    return [f for f in sorted(files) if not (base / f).is_file() or (out / f).read_bytes() != (base / f).read_bytes()]


def test_the_generator_writes_exactly_the_committed_files(regenerated):
    out, files = regenerated
    folders = {f.split("/")[0] for f in files}
    assert len(folders) == 23 and BUILTIN_DIR.resolve().is_relative_to(ROOT)
    lists = {f"{d}/{LISTS_FILE}" for d in folders}
    assert committed() == files | lists
    assert differing(out, BUILTIN_DIR, files) == []


def test_every_committed_list_is_keyed_to_its_task_as_committed():
    # task_from_folder raises on a lists file whose key differs from the folder's tests, oracle and
    # workspace (a stale list: rerun generate.py); with a current key it needs no sandbox
    folders = sorted({f.split("/")[0] for f in committed()})
    tasks = [task_from_folder(BUILTIN_DIR / d, BUILTIN, reward="p6") for d in folders]
    assert [t.task_id for t in tasks] == [f"{BUILTIN}/{d}" for d in folders]


def test_an_edited_or_missing_folder_file_is_caught(regenerated, tmp_path):
    import shutil

    out, files = regenerated
    base = tmp_path / "terminal"
    shutil.copytree(BUILTIN_DIR, base)
    edited = sorted(f for f in files if f.endswith("tests/test_outputs.py"))[0]
    (base / edited).write_bytes((base / edited).read_bytes().replace(b"==", b"!=", 1))
    gone = sorted(f for f in files if f.endswith("solution.sh"))[0]
    (base / gone).unlink()
    assert differing(out, base, files) == sorted([edited, gone])
