import subprocess
from pathlib import Path

SUMS = [('e2f4410af49987959450ed265783948d311dc103bb0e87afa001631abe1d3b0a', 'README.txt'), ('9280565465f53fdbeb74d60e4cbd7a714bb93d21df1981779ebf133a50034430', 'app-linux.tar'), ('423196074eda3ad8db7e92a7eaf1d969541b571d7d43ed1a01ea8a1622c7c350', 'app-mac.tar'), ('822b15c43a36ed92608ab9015734d82cb8f53a91310902edcd804281be69d4c3', 'app-win.zip'), ('268cb7f71a09999ddffed50ba9069aab0b06bccbd2984d8a44178f246fc6c35f', 'notes/CHANGES.txt')]
SIZE = 409


def lines():
    return Path("/app/release/SHA256SUMS").read_text().splitlines()


def test_manifest_lines():
    assert lines() == [f"{h}  {p}" for h, p in SUMS]


def test_does_not_list_itself():
    assert not any(l.endswith("SHA256SUMS") for l in lines())


def test_verifies():
    r = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd="/app/release", capture_output=True, timeout=10)
    assert r.returncode == 0


def test_total_size():
    assert Path("/app/release_size.txt").read_text().strip() == str(SIZE)
