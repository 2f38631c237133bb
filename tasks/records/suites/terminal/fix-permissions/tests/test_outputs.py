import stat
from pathlib import Path


def mode(p):
    return stat.S_IMODE(Path(p).stat().st_mode)


def test_scripts_executable():
    assert mode("/app/scripts/deploy.sh") == 0o755 and mode("/app/scripts/backup.sh") == 0o755


def test_readme_not_executable():
    assert mode("/app/scripts/README") == 0o644


def test_keys_private():
    assert mode("/app/secrets/server.key") == 0o600 and mode("/app/secrets/client.key") == 0o600


def test_secrets_dir_private():
    assert mode("/app/secrets") == 0o700


def test_public_readable():
    assert mode("/app/public/index.html") == 0o644 and mode("/app/public/style.css") == 0o644


def test_deploy_ran():
    assert Path("/app/deploy.out").read_text() == "deploy\n"
