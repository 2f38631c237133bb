"""tasks/environments/sandbox/docker_backend.remove_orphans: a sandbox container whose owner process of
this host is gone is removed; one whose owner lives, or of another host, stays; a container that
disappears while the listing is read is no error (two processes on one host list at once)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.facilities import docker_missing, require


def test_removes_only_the_containers_of_dead_owners_of_this_host():
    require("sandbox backend docker", docker_missing())
    from tasks.environments.sandbox.docker_backend import LABEL, remove_orphans
    from tasks.environments.sandbox.image import docker_client, image_tag

    client = docker_client(None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer exists (reaped)
    me = socket.gethostname()
    owners = {"dead": f"{me}:{dead.pid}", "alive": f"{me}:{os.getpid()}", "other-host": f"elsewhere-{me}:{dead.pid}"}
    made = {k: client.containers.create(image_tag(), ["true"], labels={LABEL: "1", f"{LABEL}.owner": v,
                                                                        f"{LABEL}.test": "orphans"})
            for k, v in owners.items()}
    try:
        gone = remove_orphans(client)
        assert made["dead"].id in gone
        left = {c["Id"] for c in client.api.containers(all=True, filters={"label": f"{LABEL}.test=orphans"})}
        assert left == {made["alive"].id, made["other-host"].id}
        assert made["alive"].id not in remove_orphans(client)
    finally:
        for c in client.api.containers(all=True, filters={"label": f"{LABEL}.test=orphans"}):
            client.api.remove_container(c["Id"], force=True)


def test_a_container_removed_during_the_listing_is_no_error(monkeypatch):
    """The daemon's listing names a container that is gone by the time it is looked at (another
    process's sandbox, removed in between): the cleanup goes on. Docker SDK's high-level
    ``containers.list`` inspects every listed id and raised NotFound here."""
    require("sandbox backend docker", docker_missing())
    from tasks.environments.sandbox.docker_backend import LABEL, remove_orphans
    from tasks.environments.sandbox.image import docker_client

    client = docker_client(None)
    real = client.api.containers
    vanished = {"Id": "0" * 64, "Labels": {LABEL: "1", f"{LABEL}.owner": f"{socket.gethostname()}:999999999"}}
    monkeypatch.setattr(client.api, "containers", lambda **kw: [*real(**kw), vanished])
    assert vanished["Id"] not in remove_orphans(client)  # the daemon's own NotFound, taken as gone
