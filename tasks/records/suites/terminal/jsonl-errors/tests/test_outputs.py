import json
from pathlib import Path

ERRORS = [{'ts': '2024-06-01T12:01:17Z', 'path': '/a', 'status': 503}, {'ts': '2024-06-01T12:01:17Z', 'path': '/c/d', 'status': 500}, {'ts': '2024-06-01T12:02:04Z', 'path': '/b', 'status': 503}, {'ts': '2024-06-01T12:08:37Z', 'path': '/c/d', 'status': 503}, {'ts': '2024-06-01T12:10:38Z', 'path': '/a', 'status': 500}, {'ts': '2024-06-01T12:11:44Z', 'path': '/c/d', 'status': 503}, {'ts': '2024-06-01T12:13:25Z', 'path': '/a', 'status': 503}, {'ts': '2024-06-01T12:17:59Z', 'path': '/c/d', 'status': 502}, {'ts': '2024-06-01T12:19:36Z', 'path': '/b', 'status': 502}, {'ts': '2024-06-01T12:19:36Z', 'path': '/c/d', 'status': 502}, {'ts': '2024-06-01T12:20:38Z', 'path': '/c/d', 'status': 503}, {'ts': '2024-06-01T12:28:54Z', 'path': '/b', 'status': 502}, {'ts': '2024-06-01T12:29:02Z', 'path': '/b', 'status': 503}, {'ts': '2024-06-01T12:30:30Z', 'path': '/c/d', 'status': 503}, {'ts': '2024-06-01T12:31:40Z', 'path': '/a', 'status': 503}, {'ts': '2024-06-01T12:33:56Z', 'path': '/b', 'status': 503}, {'ts': '2024-06-01T12:34:08Z', 'path': '/c/d', 'status': 503}, {'ts': '2024-06-01T12:49:25Z', 'path': '/a', 'status': 502}, {'ts': '2024-06-01T12:53:11Z', 'path': '/a', 'status': 500}, {'ts': '2024-06-01T12:57:02Z', 'path': '/b', 'status': 502}, {'ts': '2024-06-01T12:58:08Z', 'path': '/a', 'status': 502}]
SLOW = ['/a', '/b', '/c/d']


def errors():
    return [json.loads(l) for l in Path("/app/errors.jsonl").read_text().splitlines() if l.strip()]


def test_only_server_errors():
    assert errors() and all(e["status"] >= 500 for e in errors())


def test_fields():
    assert all(set(e) == {"ts", "path", "status"} for e in errors())


def test_exact_records_in_order():
    assert errors() == ERRORS


def test_slow_paths():
    assert Path("/app/slow_paths.txt").read_text().split() == SLOW
