from pathlib import Path


def test_version_file():
    assert Path("/app/VERSION").read_text().strip() == "1.5.0"


def test_setup_cfg():
    assert "version = 1.5.0" in Path("/app/setup.cfg").read_text().splitlines()


def test_changelog():
    assert Path("/app/CHANGELOG.md").read_text() == (
        "# Changelog\n\n## 1.5.0\n- add --json flag\n- faster startup\n\n## 1.4.9\n- fix crash on empty input\n")


def test_pending_emptied():
    assert Path("/app/pending.txt").read_text().strip() == ""
