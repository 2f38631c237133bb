import json

ACTIVE = {'user2@example.com': 'User 2', 'user3@example.com': 'User 3', 'user4@example.com': 'User 4', 'user7@example.com': 'User 7', 'user8@example.com': 'User 8', 'user11@example.com': 'User 11', 'user12@example.com': 'User 12', 'user13@example.com': 'User 13'}
ROLES = {'admin': 8, 'ops': 7, 'viewer': 9, 'dev': 7}


def load(p):
    with open(p) as f:
        return json.load(f)


def test_active_users_is_object():
    assert isinstance(load("/app/active_users.json"), dict)


def test_active_users():
    assert load("/app/active_users.json") == ACTIVE


def test_role_counts():
    assert load("/app/role_counts.json") == ROLES
