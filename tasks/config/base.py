"""What every config section shares: the strict model base, the error type, the stage names."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer





STAGES = ("freeze", "rollout", "train", "evaluate", "analyze")
# Fields that say how a stage runs, never what it writes: left out of section hashes (cache keys).
EXECUTION_ONLY = {"rollout": {"task_runner", "workers", "dask_address", "ray_address", "worker_timeout_s"},
                  "train": {"distributed"}}
# Optional top-level sections left out of section hashes when absent, so adding one to a stage's
# sections keeps the cache keys of configs without it.
OPTIONAL_SECTIONS = {"arms", "sweep", "quick"}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LaterOptions(_Strict):
    """A section whose options named in ``_later`` were added after configs were written: unset
    (None), they are left out of every dump, so the config hash, the stage cache keys, the plan
    and the pre-registration of a config that does not use them stay what they were."""

    _later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _drop_unset_later(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for k in self._later:
            if out.get(k) is None:
                out.pop(k, None)
        return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``, recursing where both values are mappings (a new dict; the
    inputs are not changed). Any other value in ``over`` (list, scalar, None) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
