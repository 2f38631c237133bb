import importlib.util
import subprocess
import sys


def mod():
    spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_mean_not_floored():
    assert mod().mean([1, 2]) == 1.5


def test_median_even_and_odd():
    m = mod()
    assert m.median([4, 1, 3, 2]) == 2.5 and m.median([5, 1, 3]) == 3


def test_reads_blank_lines_and_decimals(tmp_path):
    p = tmp_path / "n.txt"
    p.write_text("1.5\n\n2.5\n  \n3\n")
    assert mod().read_numbers(str(p)) == [1.5, 2.5, 3]


def test_cli_output(tmp_path):
    p = tmp_path / "n.txt"
    p.write_text("10\n\n20\n30\n40\n")
    r = subprocess.run([sys.executable, "/app/stats.py", str(p)], capture_output=True, text=True, timeout=10)
    assert r.stdout.strip() == "count=4 mean=25.00 median=25.00"


def test_numbers_out():
    assert open("/app/numbers.out").read().strip() == "count=6 mean=18.00 median=15.50"
