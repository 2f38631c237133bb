from pathlib import Path

EXPECTED = [('INFO', 110), ('DEBUG', 62), ('WARN', 41), ('ERROR', 27)]


def lines():
    return Path("/app/report.txt").read_text().strip().splitlines()


def test_report_exists():
    assert Path("/app/report.txt").is_file()


def test_error_count():
    assert "ERROR 27" in lines()


def test_all_levels_counted():
    got = dict(l.split() for l in lines())
    assert {k: int(v) for k, v in got.items()} == dict(EXPECTED)


def test_sorted_by_count():
    assert lines() == [f"{k} {v}" for k, v in EXPECTED]


def test_top_error_component():
    assert Path("/app/top_error_component.txt").read_text().strip() == 'api'
