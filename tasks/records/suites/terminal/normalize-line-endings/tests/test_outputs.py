from pathlib import Path

EXPECTED = {'docs/a.txt': 'first line\nsecond line\nthird\n', 'docs/b.txt': 'unix line\nno newline at end\n', 'docs/c.txt': 'mixed\nendings\nhere\n'}


def test_no_crlf():
    assert all(b"\r" not in (Path("/app") / p).read_bytes() for p in EXPECTED)


def test_no_trailing_whitespace():
    for p in EXPECTED:
        assert all(l == l.rstrip() for l in (Path("/app") / p).read_text().split("\n"))


def test_exact_contents():
    assert {p: (Path("/app") / p).read_bytes().decode() for p in EXPECTED} == EXPECTED


def test_markdown_untouched():
    assert Path("/app/docs/keep.md").read_bytes() == b"markdown\r\nstays\r\n"
