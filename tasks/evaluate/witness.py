"""The Prefect server as a second, independent witness of a sealed evaluation.

When the plan hash and the chain head are signed (:mod:`tasks.evaluate.signing`), each is also
recorded on the Prefect API as a markdown artifact (the server stamps its own ``created`` time):
key ``harnessrl-plan-<plan hash[:40]>`` / ``harnessrl-head-<plan hash[:40]>``, content one JSON
line ``{"kind", "plan_hash", "value", "fingerprint"}``. Both keys derive from the plan hash, so a
forger who re-seals a run can only add later versions under the same keys: :func:`check_witness`
compares the run with the EARLIEST version of each key, and requires the plan to have been
witnessed no later than the head.

Recorded only where a Prefect API is in use (inside a flow or task run, or with
``PREFECT_API_URL`` set): elsewhere (unit tests calling the stage directly) nothing is recorded and
the log says so; ``harnessrl verify --witness`` then fails for that run, naming the missing key.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tasks.evaluate.seal import SealError

log = logging.getLogger("harnessrl.evaluate")


def artifact_key(kind: str, plan_hash: str) -> str:
    """The artifact key of ``kind`` (``plan`` | ``head``) for a plan hash (lowercase hex)."""
    if kind not in ("plan", "head"):
        raise ValueError(f"witness kind={kind!r}: expected 'plan' or 'head'")
    return f"harnessrl-{kind}-{plan_hash[:40]}"


def _api_in_use() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import PREFECT_API_URL

    return bool(os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()
                or FlowRunContext.get() or TaskRunContext.get())


def record(kind: str, plan_hash: str, value: str, fingerprint: str) -> str | None:
    """Record ``value`` (the plan hash or the chain head) as a Prefect markdown artifact, now.
    Returns the artifact key, or None when no Prefect API is in use (logged).

    Raises:
        ValueError: unknown ``kind``.
    """
    key = artifact_key(kind, plan_hash)
    if not _api_in_use():
        log.warning("no Prefect API in use: the %s %s is not witnessed (harnessrl verify --witness will fail)",
                    kind, value[:16])
        return None
    from prefect.artifacts import create_markdown_artifact

    body = json.dumps({"kind": kind, "plan_hash": plan_hash, "value": value, "fingerprint": fingerprint},
                      sort_keys=True)
    create_markdown_artifact(markdown=body, key=key, description=f"harnessrl sealed evaluation: {kind} hash")
    log.info("witnessed by the Prefect API: %s = %s", key, value[:16])
    return key


def check_witness(plan_hash: str, head: str) -> dict[str, Any]:
    """Compare the run's plan hash and chain head with the earliest Prefect artifact of each key.
    Returns ``{"plan": created time, "head": created time}`` (ISO strings, the server's clock).

    Raises:
        SealError: no artifact under a key, the earliest one holds another value, or the head was
            witnessed before the plan (the message names the key).
        RuntimeError: no Prefect API answers.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    out: dict[str, Any] = {}
    with get_client(sync_client=True) as client:
        for kind, value in (("plan", plan_hash), ("head", head)):
            key = artifact_key(kind, plan_hash)
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                         sort=ArtifactSort.CREATED_DESC, limit=200)
            if not arts:
                raise SealError(f"witness {key}: no Prefect artifact (the {kind} hash was never witnessed)")
            first = min(arts, key=lambda a: a.created)
            try:
                got = json.loads(first.data)["value"]
            except (TypeError, ValueError, KeyError) as e:
                raise SealError(f"witness {key}: malformed artifact ({e})") from None
            if got != value:
                raise SealError(f"witness {key}: the Prefect server recorded {got[:16]}... at {first.created}, the "
                                f"run's {kind} hash is {value[:16]}...")
            out[kind] = first.created
    if out["head"] < out["plan"]:
        raise SealError(f"witness: the head was recorded at {out['head']}, before the plan at {out['plan']}")
    return {k: v.isoformat() for k, v in out.items()}
