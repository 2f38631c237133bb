from pathlib import Path


def entries():
    return dict(l.split() for l in Path("/app/loc.txt").read_text().strip().splitlines())


def test_three_lines():
    assert len(Path("/app/loc.txt").read_text().strip().splitlines()) == 3


def test_python_lines():
    assert int(entries()["py"]) == 102


def test_javascript_lines():
    assert int(entries()["js"]) == 28


def test_total():
    assert int(entries()["total"]) == 130
