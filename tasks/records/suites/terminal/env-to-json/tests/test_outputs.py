import json

EXPECTED = {'APP_NAME': 'Demo App', 'APP_PORT': '8080', 'DB_URL': 'postgres://user:pw@db:5432/app', 'DB_POOL': '5', 'EMPTY_VALUE': '', 'QUOTED_HASH': 'value # not a comment', 'TRAILING': 'plain'}


def got():
    with open("/app/env.json") as f:
        return json.load(f)


def test_valid_json_object():
    assert isinstance(got(), dict)


def test_keys():
    assert sorted(got()) == sorted(EXPECTED)


def test_quoted_values():
    g = got()
    assert g["APP_NAME"] == "Demo App" and g["DB_URL"] == EXPECTED["DB_URL"] and g["QUOTED_HASH"] == EXPECTED["QUOTED_HASH"]


def test_unquoted_values():
    g = got()
    assert (g["APP_PORT"], g["DB_POOL"], g["TRAILING"], g["EMPTY_VALUE"]) == ("8080", "5", "plain", "")
