"""The docker sandbox image, built from this machine's own files (no image registry needed).

``infra/sandbox/rootfs.toml`` names an interpreter, its standard library, commands, symlinks and
small files; :func:`collect` turns it into a list of root-filesystem entries (adding every shared
library the programs load, as ``ldd`` reports, and the symlinks along each path), plus the pytest
site (:func:`~tasks.environments.sandbox.base.sandbox_site`) at ``/opt/harnessrl/site``.
:func:`image_tag` hashes the entries (paths, modes, link targets, file contents) and the image
settings: ``harnessrl-sandbox:<16 hex digits>``, so any change of an input gives a new tag and
an unchanged checkout reuses the built image. :func:`build_image` writes a deterministic tar
(sorted, owner root, setuid/setgid bits cleared, source mtimes kept so the stdlib's .pyc files
stay valid) and imports it (``docker import``) unless the tag exists.

CLI: ``python -m tasks.environments.sandbox.image tag|build [--docker-host URL]``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import io
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
MANIFEST = REPO_ROOT / "infra" / "sandbox" / "rootfs.toml"
REPOSITORY = "harnessrl-sandbox"
IMAGE_CHANGES = ("USER 65534:65534", "WORKDIR /app", "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONPATH=/opt/harnessrl/site",
                 'CMD ["/usr/bin/python3"]', "LABEL harnessrl.sandbox.image=1")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class ImageError(RuntimeError):
    """The image cannot be assembled (a file named by the manifest is missing) or built."""


@dataclass(frozen=True)
class Entry:
    """One root-filesystem entry: ``kind`` file|dir|link|data; ``src`` the host path (file),
    the link target (link) or the text (data); ``mode`` permission bits; ``mtime`` seconds."""

    path: str
    kind: str
    src: str
    mode: int
    mtime: int = 0


def _ldd(paths: list[str]) -> set[str]:
    """Every shared library (absolute path, the loader included) the ELF files ``paths`` load."""
    libs: set[str] = set()
    for i in range(0, len(paths), 256):
        out = subprocess.run(["ldd", *paths[i:i + 256]], capture_output=True, text=True)
        libs.update(m.group(1) for m in _LDD_PATH.finditer(out.stdout))  # non-ELF files print no paths
    return libs


class _Collector:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.elves: list[str] = []  # programs and extension modules whose libraries to add

    def _parents(self, path: str) -> None:
        p = os.path.dirname(path)
        while p not in ("/", ""):
            if p not in self.entries:
                self.entries[p] = Entry(p, "dir", "", 0o755)
            p = os.path.dirname(p)

    def add(self, path: str, *, arc: str | None = None) -> None:
        """Add host ``path`` (at ``arc`` in the image, default the same), following symlinks along
        it and adding them as symlinks."""
        if arc is None:
            cur = "/"
            parts = Path(path).parts[1:]
            for i, part in enumerate(parts):
                cur = os.path.join(cur, part)
                if os.path.islink(cur):
                    target = os.readlink(cur)
                    self._parents(cur)
                    self.entries.setdefault(cur, Entry(cur, "link", target, 0o777))
                    resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
                    return self.add(os.path.join(resolved, *parts[i + 1:]))
            arc = path
        st = os.lstat(path)
        self._parents(arc)
        if stat.S_ISDIR(st.st_mode):
            self.entries.setdefault(arc, Entry(arc, "dir", "", stat.S_IMODE(st.st_mode) & 0o1777, int(st.st_mtime)))
        elif stat.S_ISLNK(st.st_mode):
            self.entries.setdefault(arc, Entry(arc, "link", os.readlink(path), 0o777))
        elif stat.S_ISREG(st.st_mode):
            self.entries[arc] = Entry(arc, "file", path, stat.S_IMODE(st.st_mode) & 0o1777, int(st.st_mtime))

    def add_elf(self, path: str) -> None:
        self.add(path)
        self.elves.append(path)

    def add_tree(self, root: str, arc_root: str, exclude: list[str]) -> None:
        root_p = Path(root)
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root_p).as_posix()
            keep = []
            for d in sorted(dirnames):
                rel = d if rel_dir == "." else f"{rel_dir}/{d}"
                if rel in exclude or os.path.islink(os.path.join(dirpath, d)):
                    if rel not in exclude:
                        self.add(os.path.join(dirpath, d), arc=f"{arc_root}/{rel}")
                    continue
                keep.append(d)
            dirnames[:] = keep
            for f in sorted(filenames):
                rel = f if rel_dir == "." else f"{rel_dir}/{f}"
                if rel in exclude or ".opt-1.pyc" in f or ".opt-2.pyc" in f:
                    continue
                src = os.path.join(dirpath, f)
                self.add(src, arc=f"{arc_root}/{rel}")
                if f.endswith(".so"):
                    self.elves.append(src)


def collect(site: Path | None = None, *, libraries: bool = True) -> list[Entry]:
    """The image's root filesystem entries, sorted by path.

    ``site``: the pytest folder to put at /opt/harnessrl/site (default: ``sandbox_site()``;
    skipped when missing). ``libraries``: add the shared libraries the programs load (one
    ``ldd`` run over all of them, a few seconds). Raises ImageError when a program or folder the
    manifest names is missing on this machine.
    """
    from tasks.environments.sandbox.base import sandbox_site

    m = tomllib.loads(MANIFEST.read_text())
    c = _Collector()
    for p in (m["python"], m["stdlib"]):
        if not os.path.exists(p):
            raise ImageError(f"{MANIFEST}: {p} does not exist on this machine (apt-get install python3.11)")
    c.add_elf(m["python"])
    c.add_tree(m["stdlib"], m["stdlib"], list(m.get("stdlib_exclude", [])))
    for cmd in m["commands"]:
        hits = [d + "/" + cmd for d in ("/usr/bin", "/usr/sbin") if os.path.exists(d + "/" + cmd)]
        if not hits:
            raise ImageError(f"{MANIFEST}: command {cmd!r} is not installed in /usr/bin or /usr/sbin")
        c.add_elf(hits[0])
    site = sandbox_site() if site is None else site
    if site is not None and site.is_dir():
        c.add_tree(str(site), "/opt/harnessrl/site", ["bin"])
    if libraries:
        for lib in sorted(_ldd(c.elves)):
            c.add(lib)
    for path, target in m.get("links", {}).items():
        c._parents(path)
        c.entries[path] = Entry(path, "link", target, 0o777)
    for path, text in m.get("files", {}).items():
        c._parents(path)
        c.entries[path] = Entry(path, "data", text, 0o644)
    for path, mode in m.get("dirs", {}).items():
        c._parents(path)
        c.entries[path] = Entry(path, "dir", "", int(mode))
    return sorted(c.entries.values(), key=lambda e: e.path)


def _digest(e: Entry) -> str:
    if e.kind == "file":
        h = hashlib.sha256()
        with open(e.src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    return e.src


@functools.lru_cache(maxsize=4)
def image_tag(site: str | None = None) -> str:
    """``harnessrl-sandbox:<first 16 hex digits of sha256>`` over every entry the manifest names
    (path, kind, mode, mtime, content sha256 / link target / text), the manifest, this module's
    source and :data:`IMAGE_CHANGES`. The shared libraries ``ldd`` finds are left out (the image
    carries its own copies, so a host library update does not make it stale, and the tag stays
    cheap: about 0.3 s per process, cached). ``site``: see :func:`collect`."""
    entries = collect(Path(site) if site else None, libraries=False)
    rows = [[e.path, e.kind, e.mode, e.mtime, _digest(e)] for e in entries]
    h = hashlib.sha256(json.dumps({"entries": rows, "changes": IMAGE_CHANGES, "manifest": MANIFEST.read_text(),
                                   "builder": Path(__file__).read_text()}).encode()).hexdigest()
    return f"{REPOSITORY}:{h[:16]}"


def write_tar(entries: list[Entry], out) -> None:  # noqa: ANN001 - a binary file object
    """The root filesystem as an uncompressed tar on ``out``: owner 0:0, no setuid/setgid bits."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            ti = tarfile.TarInfo(e.path.lstrip("/"))
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mode = e.mode & 0o1777
            ti.mtime = e.mtime
            if e.kind == "dir":
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            elif e.kind == "link":
                ti.type = tarfile.SYMTYPE
                ti.linkname = e.src
                tar.addfile(ti)
            elif e.kind == "data":
                data = e.src.encode()
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            else:
                ti.size = os.path.getsize(e.src)
                with open(e.src, "rb") as f:
                    tar.addfile(ti, f)


def docker_client(base_url: str | None = None):  # noqa: ANN201 - docker.DockerClient
    """A docker SDK client for ``base_url`` (None: ``$DOCKER_HOST`` or the default socket),
    checked with a ping. Raises ``docker.errors.DockerException`` when no daemon answers."""
    import docker

    client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
    client.ping()
    return client


def build_image(client, *, force: bool = False) -> str:  # noqa: ANN001 - docker.DockerClient
    """Build (``docker import``) the image unless its tag exists (or ``force``); return the tag.

    Checks the result by running ``python3 -c`` in a throwaway container (network none).
    Raises ImageError when the import or the check fails.
    """
    import docker

    tag = image_tag()
    if not force:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
    entries = collect()
    repo, _, version = tag.partition(":")
    with tempfile.NamedTemporaryFile(prefix="harnessrl-rootfs-", suffix=".tar") as f:
        write_tar(entries, f)
        f.flush()
        size = f.tell()
        try:
            client.api.import_image_from_file(f.name, repository=repo, tag=version, changes=list(IMAGE_CHANGES))
        except docker.errors.APIError as e:
            raise ImageError(f"docker import of {tag} failed: {e}") from e
    try:
        out = client.containers.run(tag, ["python3", "-c", "import sys, pytest; print(sys.version_info[:2])"],
                                    network_mode="none", remove=True, read_only=True)
    except docker.errors.DockerException as e:
        client.images.remove(tag, force=True)
        raise ImageError(f"the new image {tag} does not run python3 with pytest: {e}") from e
    print(f"sandbox image: built {tag} ({size / 1e6:.1f} MB tar, {len(entries)} entries), "
          f"python {out.decode().strip()}")
    return tag


def main(argv: list[str]) -> int:
    """CLI: ``tag`` prints the tag; ``build`` builds it when absent (``--force``: always)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tasks.environments.sandbox.image")
    ap.add_argument("command", choices=["tag", "build"])
    ap.add_argument("--docker-host", default=None)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    if a.command == "tag":
        print(image_tag())
        return 0
    t0 = time.monotonic()
    tag = build_image(docker_client(a.docker_host), force=a.force)
    print(f"sandbox image: {tag} ready ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
