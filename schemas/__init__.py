"""Artifact contracts (pyarrow schema + Great Expectations suite + version) and the one store
that writes and reads every Parquet artifact of a run."""

from schemas.contracts import CONTRACTS, Contract, get_contract
from schemas.store import ArtifactError, ArtifactRef, ArtifactStore

__all__ = ["CONTRACTS", "Contract", "get_contract", "ArtifactError", "ArtifactRef", "ArtifactStore"]
