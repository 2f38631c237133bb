from pathlib import Path

BIG = []
SIZES = {'a/log1.txt': 1000, 'a/log2.txt': 10, 'b/big.dat': 10, 'b/c/huge.dat': 999, 'small.txt': 1000, 'b/c/medium.txt': 10, 'edge.txt': 1000, 'd/tiny.cfg': 10}


def test_listing():
    assert Path("/app/large_files.txt").read_text().strip().splitlines() == [f"{s} {p}" for s, p in BIG]


def test_moved_to_archive():
    assert all((Path("/app/archive") / p).stat().st_size == s for s, p in BIG)


def test_removed_from_storage():
    assert not any((Path("/app/storage") / p).exists() for _, p in BIG)


def test_small_files_stay():
    small = [p for p, s in SIZES.items() if s <= 1000]
    assert all((Path("/app/storage") / p).is_file() for p in small)
