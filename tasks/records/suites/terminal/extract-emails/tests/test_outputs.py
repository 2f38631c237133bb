from pathlib import Path

EXPECTED = ['bob.smith@corp.test', 'bob.smith@example.com', 'bob.smith@mail.example.org', 'carol_w@corp.test', 'carol_w@example.com', 'carol_w@mail.example.org', 'dave+news@corp.test', 'dave+news@example.com', 'dave+news@mail.example.org', 'eve@example.com', 'eve@mail.example.org', 'frank.o@corp.test', 'frank.o@example.com', 'frank.o@mail.example.org']


def got():
    return Path("/app/emails.txt").read_text().split()


def test_all_found():
    assert set(EXPECTED) <= set(got())


def test_nothing_else():
    assert set(got()) <= set(EXPECTED)


def test_sorted_unique_lowercase():
    assert got() == EXPECTED


def test_count():
    assert Path("/app/email_count.txt").read_text().strip() == "14"
