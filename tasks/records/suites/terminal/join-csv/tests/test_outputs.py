import csv

JOINED = [('Adam', 'Support'), ('Ava', 'Finance'), ('Emma', 'Engineering'), ('Ethan', 'Engineering'), ('Ivy', 'Engineering'), ('Liam', 'Support'), ('Lucas', 'Finance'), ('Mia', 'Engineering'), ('Noah', 'Sales'), ('Nora', 'Sales'), ('Olivia', 'UNKNOWN'), ('Zoe', 'Sales')]
SIZES = [('Engineering', 4), ('Finance', 2), ('Sales', 3), ('Support', 2), ('UNKNOWN', 1)]


def rows(p):
    with open(p, newline="") as f:
        return list(csv.reader(f))


def test_joined_header():
    assert rows("/app/joined.csv")[0] == ["name", "dept_name"]


def test_joined_rows():
    assert [tuple(r) for r in rows("/app/joined.csv")[1:]] == JOINED


def test_unknown_department():
    assert any(r[1] == "UNKNOWN" for r in rows("/app/joined.csv")[1:])


def test_dept_sizes():
    r = rows("/app/dept_sizes.csv")
    assert r[0] == ["dept_name", "employees"] and [(a, int(b)) for a, b in r[1:]] == SIZES
