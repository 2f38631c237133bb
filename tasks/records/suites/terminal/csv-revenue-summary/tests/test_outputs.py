import csv
from pathlib import Path

EXPECTED = [('central', '3851.95', 146), ('east', '3513.27', 135), ('north', '2023.22', 125), ('south', '4436.33', 168), ('west', '2653.06', 108)]


def rows():
    with open("/app/summary.csv", newline="") as f:
        return list(csv.reader(f))


def test_header():
    assert rows()[0] == ["region", "revenue", "units"]


def test_one_row_per_region_sorted():
    assert [r[0] for r in rows()[1:]] == [e[0] for e in EXPECTED]


def test_revenue():
    assert [r[1] for r in rows()[1:]] == [e[1] for e in EXPECTED]


def test_units():
    assert [int(r[2]) for r in rows()[1:]] == [e[2] for e in EXPECTED]
