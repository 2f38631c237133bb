from pathlib import Path

GROUPS = ['a/data-backup.csv d/data.csv', 'a/notes.md c/notes-old.md', 'a/report.txt b/report-copy.txt c/deep/x.txt']
DATA = Path("/app/data")


def test_duplicates_file():
    assert Path("/app/duplicates.txt").read_text().splitlines() == GROUPS


def test_first_of_each_group_kept():
    for g in GROUPS:
        assert (DATA / g.split()[0]).is_file()


def test_other_copies_deleted():
    for g in GROUPS:
        for p in g.split()[1:]:
            assert not (DATA / p).exists(), p


def test_unique_files_kept():
    assert (DATA / "d/unique.txt").is_file() and (DATA / "e/lonely.txt").is_file()
