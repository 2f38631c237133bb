"""The harness specs a run froze, read back from its ``harnesses`` artifact."""

from __future__ import annotations

import json

from schemas import ArtifactRef, ArtifactStore
from tasks.harnesses.spec import HarnessSpec


def harness_specs(store: ArtifactStore, ref: ArtifactRef) -> dict[str, HarnessSpec]:
    """Frozen harness specs by harness_id, rebuilt from the ``harnesses`` artifact (not from the
    YAML files, which may have changed since freeze). Raises ValueError if a spec's hash differs."""
    out = {}
    for row in store.rows(ref):
        spec = HarnessSpec.model_validate(json.loads(row["spec_json"]))
        if spec.harness_id != row["harness_id"]:
            raise ValueError(f"harness {row['name']!r}: frozen spec hashes to {spec.harness_id[:12]}, not {row['harness_id'][:12]}")
        out[row["harness_id"]] = spec
    return out
