"""docker backend: one container per episode, driven through the docker SDK.

The container (image :func:`~tasks.environments.sandbox.image.image_tag`, built by
``scripts/setup-docker.sh``, or ``sandbox.docker_image``) runs the exec server (``exec_server.py``) as
its process 1, as uid/gid 65534, and the host talks to it over the container's attached
stdin/stdout (docker's multiplexed stream framing). Settings: ``network_mode="none"``, a read-only
root filesystem, size-capped tmpfs at ``/app`` (``workdir_mb``, owner 65534) and ``/tmp``
(``tmp_mb``), ``/dev/shm`` of ``tmp_mb``, ``cap_drop=["ALL"]``, ``no-new-privileges``, a private IPC
namespace, ``pids_limit=max_procs`` (the pids cgroup: processes and threads), ``mem_limit`` =
``memory_mb + workdir_mb + 2 * tmp_mb + 64`` MiB with no swap, ``nano_cpus`` from ``cpus``, docker's
default seccomp profile (no nested user namespaces, no mount). Per command the server adds the
rlimits (RLIMIT_AS, CPU, FSIZE, NOFILE) and the wall clock; RLIMIT_NPROC is not used here, since
without a user namespace it would count every uid-65534 process on the host.

Every container carries the labels ``harnessrl.sandbox=1``, ``harnessrl.sandbox.id=<uuid>`` and
``harnessrl.sandbox.owner=<hostname>:<pid>``; :meth:`DockerSandbox.cleanup` removes the container
(``force=True``: killed, tmpfs gone) and :func:`remove_orphans` removes containers whose owner
process on this host is gone (run once per process, on the first sandbox).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid

from tasks.config import SandboxConfig
from tasks.environments.sandbox.base import NOBODY, SANDBOX_WORKDIR, SERVER_SOURCE, SandboxError, ServerSandbox, server_config

LABEL = "harnessrl.sandbox"
_clients: dict[str | None, object] = {}
_lock = threading.Lock()


def _client(host: str | None):  # noqa: ANN202 - docker.DockerClient
    """One docker client per docker host per process; orphans removed on first use."""
    with _lock:
        if host in _clients:
            return _clients[host]
        try:
            import docker
        except ImportError as e:  # pragma: no cover - pinned dependency
            raise SandboxError("sandbox.backend=docker needs the python package 'docker' (pip install docker==7.2.0)") from e
        try:
            from tasks.environments.sandbox.image import docker_client

            client = docker_client(host)
        except docker.errors.DockerException as e:
            raise SandboxError(f"sandbox.backend=docker but no docker daemon answers at {host or 'the default socket'}: "
                               f"{e} (run scripts/setup-docker.sh)") from e
        remove_orphans(client)
        _clients[host] = client
        return client


def remove_orphans(client) -> list[str]:  # noqa: ANN001 - docker.DockerClient
    """Remove sandbox containers whose owner (``<hostname>:<pid>`` label) is a process of this
    host that no longer exists; returns their ids. Containers of other hosts are left alone."""
    import docker

    me = socket.gethostname()
    gone = []
    # the low-level listing (ids and labels in one call): the high-level one inspects each
    # container after listing, and another process's sandbox removed in between raised NotFound
    for c in client.api.containers(all=True, filters={"label": LABEL}):
        host, _, pid = (c.get("Labels") or {}).get(f"{LABEL}.owner", "").rpartition(":")
        if host != me or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            client.api.remove_container(c["Id"], force=True)
            gone.append(c["Id"])
        except docker.errors.NotFound:
            pass
    return gone


class DockerSandbox(ServerSandbox):
    """A docker container for one episode, created and started by the constructor. Use as a
    context manager or call :meth:`cleanup`.

    Raises (constructor): SandboxError when no daemon answers, the image is missing (the
    message names the tag and ``scripts/setup-docker.sh``), or the container does not start.
    """

    def __init__(self, cfg: SandboxConfig):
        super().__init__(cfg)
        import docker

        self._container = None
        self._sock = None
        client = _client(cfg.docker_host)
        if cfg.docker_image is not None:
            image = cfg.docker_image
        else:
            from tasks.environments.sandbox.image import image_tag

            image = image_tag()
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"sandbox image {image} is not built on this docker daemon "
                               f"(run scripts/setup-docker.sh)") from None
        self.id = uuid.uuid4().hex
        self.image = image
        mib = 1024 * 1024
        mem = (cfg.memory_mb + cfg.workdir_mb + 2 * cfg.tmp_mb + 64) * mib
        try:
            self._container = client.containers.create(
                image, ["/usr/bin/python3", "-I", "-S", "-c", SERVER_SOURCE, server_config(cfg, site=True, nproc=False)],
                user=f"{NOBODY}:{NOBODY}", working_dir=SANDBOX_WORKDIR, hostname="sandbox",
                stdin_open=True, tty=False, detach=True,
                network_mode="none", read_only=True,
                tmpfs={SANDBOX_WORKDIR: f"size={cfg.workdir_mb}m,mode=0755,uid={NOBODY},gid={NOBODY},exec",
                       "/tmp": f"size={cfg.tmp_mb}m,mode=1777,exec"},
                shm_size=f"{cfg.tmp_mb}m", ipc_mode="private",
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                mem_limit=mem, memswap_limit=mem, pids_limit=cfg.max_procs + 1,
                nano_cpus=int(cfg.cpus * 1e9),
                labels={LABEL: "1", f"{LABEL}.id": self.id, f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"},
                environment={}, auto_remove=False,
            )
            sock = client.api.attach_socket(self._container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
            self._sock = getattr(sock, "_sock", sock)
            self._container.start()
        except docker.errors.DockerException as e:
            self._closed = True
            self._stop()
            raise SandboxError(f"the docker sandbox did not start ({image}): {e}") from e
        self._buf = bytearray()
        self._frame_left = 0
        try:
            self._call({"op": "ping"}, 20.0)
        except SandboxError as e:
            self._closed = True
            raise SandboxError(f"the docker sandbox did not start ({image}): {e}") from None

    # -- transport: docker's attach stream, frames of (8-byte header, payload) ---------------------
    def _send_bytes(self, data: bytes) -> None:
        self._sock.settimeout(30.0)
        self._sock.sendall(data)

    def _raw(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the exec server in time")
            self._sock.settimeout(left)
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise EOFError("the container's exec server exited")
            out += chunk
        return bytes(out)

    def _recv_bytes(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            if self._frame_left == 0:
                stream, size = struct.unpack(">BxxxL", self._raw(8, deadline))
                if stream != 1:
                    # only stdout is attached; anything else is a protocol error
                    raise EOFError(f"unexpected docker stream {stream}")
                self._frame_left = size
                continue
            chunk = self._raw(min(self._frame_left, max(n - len(self._buf), 65536)), deadline)
            self._frame_left -= len(chunk)
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _diagnostics(self) -> str:
        try:
            return self._container.logs(stdout=False, stderr=True).decode(errors="replace") if self._container else ""
        except Exception:  # noqa: BLE001 - best effort, for an error message
            return ""

    def _stop(self) -> None:
        import docker

        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        if self._container is not None:
            try:
                self._container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise SandboxError(f"could not remove sandbox container {self._container.id[:12]}: {e}") from e
            self._container = None

    @property
    def container_id(self) -> str | None:
        """The container's id, None once cleaned up."""
        return self._container.id if self._container is not None else None

    def processes(self) -> list[list[str]]:
        """``docker top`` rows (UID, PID, PPID, ..., CMD) of the running container; for tests."""
        if self._container is None:
            return []
        return self._container.top()["Processes"] or []
