"""Ed25519 signatures over a sealed evaluation (``cryptography``), so a third party can check it.

The plan hash is signed when the plan is committed (before the first attempt) and the chain head
(the last sealed row's ``seal_hash``) once the rows are written. The private key lives outside the
run folder: the file named by the environment variable :data:`KEY_ENV`, else
:data:`DEFAULT_KEY_PATH`; it is created on first use (PKCS#8 PEM, mode 0600). The run gets
``evaluate/signing.pub`` (the public key, PEM), ``evaluate/plan.sig`` and ``evaluate/head.sig``
(JSON: the signed hash, the key's fingerprint and the base64 signature over
``b"harnessrl-plan:" + hash`` / ``b"harnessrl-head:" + hash``).

A forger who edits rows and re-seals them with the product's own functions cannot sign the new
head without the private key; one who also swaps the folder's public key for their own is caught
when the verifier is given the expected public key (``harnessrl verify RUN --public-key KEY``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tasks.evaluate.seal import SealError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from schemas import ArtifactStore

KEY_ENV = "HARNESSRL_SIGNING_KEY"
DEFAULT_KEY_PATH = Path("~/.config/harnessrl/signing-ed25519.pem")
PUBLIC_KEY = "evaluate/signing.pub"
PLAN_SIG = "evaluate/plan.sig"
HEAD_SIG = "evaluate/head.sig"
PREREG_SIG = "freeze/preregistration.sig"
_CONTEXT = {PLAN_SIG: b"harnessrl-plan:", HEAD_SIG: b"harnessrl-head:", PREREG_SIG: b"harnessrl-prereg:"}
# the public key a signature file's run carries beside it, where it is not PUBLIC_KEY
_KEY_OF: dict[str, str] = {}


def register_signature(which: str, context: bytes, public_key: str) -> None:
    """Let an application sign files of its own with this module (e.g. tasks.talkmesh.seal):
    ``which`` is signed over ``context + hash``, its public key written to ``public_key``.

    Raises:
        ValueError: ``which`` is already registered with another context or key file.
    """
    if _CONTEXT.get(which, context) != context or _KEY_OF.get(which, public_key) != public_key:
        raise ValueError(f"signature file {which!r} is already registered differently")
    _CONTEXT[which] = context
    _KEY_OF[which] = public_key


def key_path() -> Path:
    """The private key's path: ``$HARNESSRL_SIGNING_KEY`` or :data:`DEFAULT_KEY_PATH`, expanded."""
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY_PATH).expanduser()


def load_or_create_key(path: Path | None = None) -> "Ed25519PrivateKey":
    """The Ed25519 private key at ``path`` (default :func:`key_path`), created (mode 0600, parent
    folders made) when the file does not exist.

    Raises:
        ValueError: the file exists but is not an Ed25519 private key in PEM (names the path), or
            it is readable by others (mode not 0600 or stricter).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = Path(path or key_path())
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return key
    if p.stat().st_mode & 0o077:
        raise ValueError(f"{KEY_ENV}={str(p)!r}: the signing key is readable by others (mode "
                         f"{oct(p.stat().st_mode & 0o777)}); chmod 600 it")
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except ValueError as e:
        raise ValueError(f"{KEY_ENV}={str(p)!r}: not a PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{KEY_ENV}={str(p)!r}: a {type(key).__name__}, expected an Ed25519 private key")
    return key


def public_pem(key: "Ed25519PrivateKey | Ed25519PublicKey") -> bytes:
    """The public key as SubjectPublicKeyInfo PEM."""
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if hasattr(key, "public_key") else key
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(pem: bytes) -> str:
    """``SHA256:<hex>`` of the raw 32-byte public key in ``pem``.

    Raises:
        ValueError: ``pem`` is not an Ed25519 public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    pub = serialization.load_pem_public_key(pem)
    if not isinstance(pub, Ed25519PublicKey):
        raise ValueError(f"public key: a {type(pub).__name__}, expected Ed25519")
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + hashlib.sha256(raw).hexdigest()


def sign(store: "ArtifactStore", which: str, value: str, key: "Ed25519PrivateKey") -> str:
    """Sign ``value`` (a hex hash) as ``which`` (:data:`PLAN_SIG`, :data:`HEAD_SIG`,
    :data:`PREREG_SIG`, or a file given to :func:`register_signature`), writing the signature file
    and the public key beside it (``evaluate/signing.pub``, or the registered key file); returns
    the key's fingerprint."""
    pem = public_pem(key)
    fp = fingerprint(pem)
    store.write_bytes(_KEY_OF.get(which, PUBLIC_KEY), pem)
    sig = key.sign(_CONTEXT[which] + value.encode("ascii"))
    store.write_text(which, json.dumps({"hash": value, "fingerprint": fp,
                                        "signature": base64.b64encode(sig).decode("ascii")}, sort_keys=True) + "\n")
    return fp


def check_signatures(store: "ArtifactStore", plan_hash: str, head: str, expected_pem: bytes | None,
                     sigs: tuple[str, str] = (PLAN_SIG, HEAD_SIG)) -> str:
    """Check ``plan.sig`` over ``plan_hash`` and ``head.sig`` over ``head`` with the run's public
    key, which must equal ``expected_pem`` when given. Returns the fingerprint of the key used.
    ``sigs``: the (plan, head) signature files (registered ones are checked with their key file).

    Raises:
        SealError: a signature file or the public key is missing or malformed; the run's key is
            not the expected one; a signature does not verify, or signs another hash (the message
            names the file).
    """
    key_file = _KEY_OF.get(sigs[0], PUBLIC_KEY)
    pem = _run_public_key(store, key_file)
    fp = _fingerprint_of(pem, key_file)
    if expected_pem is not None:
        want = fingerprint(expected_pem)
        if fp != want:
            raise SealError(f"{key_file}: key {fp[:23]}... is not the expected key {want[:23]}... (the run was "
                            "signed, or re-signed, by someone else)")
    for which, value in zip(sigs, (plan_hash, head)):
        check_signature(store, which, value, pem)
    return fp


def _run_public_key(store: "ArtifactStore", key_file: str = PUBLIC_KEY) -> bytes:
    """The run's public key (PEM) at ``key_file``. Raises SealError when it is missing."""
    if not store.exists(key_file):
        raise SealError(f"{key_file}: missing (a signed run carries its public key)")
    return store.read_bytes(key_file)


def _fingerprint_of(pem: bytes, key_file: str = PUBLIC_KEY) -> str:
    """:func:`fingerprint` with a malformed key reported as a SealError naming the file."""
    try:
        return fingerprint(pem)
    except ValueError as e:
        raise SealError(f"{key_file}: {e}") from None


def check_signature(store: "ArtifactStore", which: str, value: str, pem: bytes | None = None) -> None:
    """Check the signature file ``which`` over ``value`` with ``pem`` (default: the run's
    ``evaluate/signing.pub``).

    Raises:
        SealError: the file or key is missing or malformed, it signs another hash, or the
            signature does not verify (the message names the file).
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    key_file = _KEY_OF.get(which, PUBLIC_KEY)
    if pem is None:
        pem = _run_public_key(store, key_file)
    fp = _fingerprint_of(pem, key_file)
    pub = serialization.load_pem_public_key(pem)
    if not store.exists(which):
        raise SealError(f"{which}: missing (the run signs it)")
    try:
        d = json.loads(store.read_bytes(which))
        sig = base64.b64decode(d["signature"], validate=True)
    except (ValueError, KeyError, TypeError) as e:
        raise SealError(f"{which}: malformed ({type(e).__name__}: {e})") from None
    if d.get("hash") != value:
        raise SealError(f"{which}: signs {str(d.get('hash'))[:16]}..., the run's is {value[:16]}...")
    try:
        pub.verify(sig, _CONTEXT[which] + value.encode("ascii"))
    except InvalidSignature:
        raise SealError(f"{which}: the signature does not verify with {key_file} ({fp[:23]}...)") from None


@dataclass(frozen=True)
class SealFiles:
    """Where a sealed run keeps its commitment: the plan (``plan``, JSON), its hash (``plan_hash``,
    text) and the signatures over the plan hash (``plan_sig``) and the chain head (``head_sig``).
    The evaluate stage's are :data:`EVALUATE_SEAL`; an application sealing its own measurement
    (:func:`register_signature` for its signature files) has its own, and the same functions commit,
    sign and check both."""

    plan: str
    plan_hash: str
    plan_sig: str
    head_sig: str


EVALUATE_SEAL = SealFiles("evaluate/plan.json", "evaluate/plan.sha256", PLAN_SIG, HEAD_SIG)


def commit_plan(store: "ArtifactStore", files: SealFiles, plan: dict, key: "Ed25519PrivateKey", *,
                resume_as: str | None = None) -> tuple[str, str | None]:
    """Commit ``plan`` before the first sample: write it and its hash (:func:`tasks.evaluate.seal.plan_hash`)
    and sign the hash. Returns ``(plan hash, the key's fingerprint)``.

    ``resume_as``: a resumable run's name for messages; a folder that already commits this plan
    keeps it (fingerprint None: nothing signed again), one that commits another is refused.

    Raises:
        ValueError: (``resume_as`` given) the folder commits another plan (names both hashes).
    """
    from tasks.evaluate.seal import plan_hash

    ph = plan_hash(plan)
    if resume_as is not None and store.exists(files.plan_hash):
        old = store.read_bytes(files.plan_hash).decode("ascii").strip()
        if old != ph:
            raise ValueError(f"{resume_as}: {store.url}/{files.plan_hash} commits plan {old[:16]}..., this run's is "
                             f"{ph[:16]}... (a sealed run is not re-planned: use a new run folder)")
        return ph, None
    store.write_json(files.plan, plan)
    store.write_text(files.plan_hash, ph + "\n")
    return ph, sign(store, files.plan_sig, ph, key)


def sign_head(store: "ArtifactStore", files: SealFiles, head: str, key: "Ed25519PrivateKey") -> str:
    """Sign the chain ``head`` (the last sealed row's ``seal_hash``, or the plan hash when there is
    no row) after the last row is written; returns the key's fingerprint."""
    return sign(store, files.head_sig, head, key)
