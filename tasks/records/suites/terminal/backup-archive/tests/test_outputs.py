import tarfile
from pathlib import Path

KEEP = ['project/README.md', 'project/docs/guide.md', 'project/src/main.py', 'project/src/util.py']
CONTENT = {k: v for k, v in {'project/README.md': '# demo project\n', 'project/src/main.py': "print('hello')\n", 'project/src/util.py': 'def add(a, b):\n    return a + b\n', 'project/src/cache.tmp': 'scratch\n', 'project/build/out.tmp': 'scratch 2\n', 'project/docs/guide.md': 'guide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\nguide\n', 'project/.env.tmp': 'SECRET=1\n'}.items() if k in KEEP}


def members():
    with tarfile.open("/app/backup.tar.gz", "r:gz") as t:
        return {m.name.removeprefix("./"): t.extractfile(m).read().decode() for m in t.getmembers() if m.isfile()}


def test_is_gzip_tar():
    assert Path("/app/backup.tar.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert tarfile.is_tarfile("/app/backup.tar.gz")


def test_contains_all_kept_files():
    assert set(KEEP) <= set(members())


def test_no_tmp_files():
    assert not [m for m in members() if m.endswith(".tmp")]


def test_contents_match():
    m = members()
    assert all(m.get(k) == v for k, v in CONTENT.items())


def test_list_file():
    assert Path("/app/backup.list").read_text().splitlines() == KEEP
