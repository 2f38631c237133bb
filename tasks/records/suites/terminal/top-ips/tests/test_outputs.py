from pathlib import Path

TOP = [('10.0.1.1', 59), ('10.0.2.16', 38), ('10.0.1.10', 31), ('10.0.1.13', 29), ('10.0.0.5', 25)]


def top_lines():
    return Path("/app/top_ips.txt").read_text().strip().splitlines()


def test_five_lines():
    assert len(top_lines()) == 5


def test_top_ip():
    assert top_lines()[0].split() == [str(TOP[0][1]), TOP[0][0]]


def test_all_five_in_order():
    assert [l.split() for l in top_lines()] == [[str(n), ip] for ip, n in TOP]


def test_404_count():
    assert Path("/app/not_found_count.txt").read_text().strip() == "55"
