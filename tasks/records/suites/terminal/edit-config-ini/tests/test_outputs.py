import configparser
from pathlib import Path


def cfg():
    c = configparser.ConfigParser(comment_prefixes=(";", "#"))
    c.read("/app/config.ini")
    return c


def test_server_port_and_debug():
    c = cfg()
    assert c["server"]["port"] == "8080" and c["server"]["debug"] == "false"


def test_max_connections_enabled():
    assert cfg()["server"]["max_connections"] == "250"


def test_logging_level():
    assert cfg()["logging"]["level"] == "warning"


def test_database_untouched():
    c = cfg()
    assert (c["database"]["port"], c["database"]["debug"], c["database"]["host"]) == ("5432", "true", "db.internal")


def test_other_lines_unchanged():
    lines = Path("/app/config.ini").read_text().splitlines()
    assert lines[0] == "; service configuration" and "host = 0.0.0.0" in lines and len(lines) == 14
