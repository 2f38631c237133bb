import shutil
import subprocess
from pathlib import Path


def run(tmp):
    src = tmp / "my src"
    src.mkdir()
    (src / "one.txt").write_text("1\n")
    (src / "two words.txt").write_text("2\n")
    (src / "three.log").write_text("3\n")
    return subprocess.run(["bash", "/app/backup.sh", str(src), str(tmp / "out dir")], capture_output=True, text=True,
                          timeout=10)


def test_syntax_ok():
    assert subprocess.run(["bash", "-n", "/app/backup.sh"]).returncode == 0


def test_runs_and_reports_count(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "copied 2 files"


def test_copies_with_spaces(tmp_path):
    run(tmp_path)
    out = tmp_path / "out dir"
    assert sorted(p.name for p in out.iterdir()) == ["one.txt.bak", "two words.txt.bak"]
    assert (out / "two words.txt.bak").read_text() == "2\n"


def test_works_on_app_folder(tmp_path):
    r = subprocess.run(["bash", "/app/backup.sh", "/app/in", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=10)
    assert r.stdout.strip() == "copied 3 files"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.txt.bak", "b c.txt.bak", "d.txt.bak"]
