from pathlib import Path

EXPECTED = {'deploy/app.conf': 'upstream = https://api.example.com/v1\ntimeout = 5\n', 'deploy/k8s/service.yaml': 'url: api.example.com\nreplicas: 2\nbackup: api.example.com:8443\n', 'deploy/k8s/ingress.yaml': 'host: www.example.com\n', 'deploy/README.md': 'We moved off old-api.example.com in 2024.\n', 'deploy/notes/old.conf': '# legacy\napi.example.com\n'}
ROOT = Path("/app")


def test_conf_and_yaml_updated():
    for p, text in EXPECTED.items():
        if not p.endswith(".md"):
            assert (ROOT / p).read_text() == text, p


def test_markdown_untouched():
    assert (ROOT / "deploy/README.md").read_text() == EXPECTED["deploy/README.md"]


def test_no_backups():
    names = [p.name for p in (ROOT / "deploy").rglob("*")]
    assert not [n for n in names if n.endswith((".bak", "~", ".orig"))]


def test_changed_list():
    assert (ROOT / "changed.txt").read_text().split() == ["app.conf", "k8s/service.yaml", "notes/old.conf"]
