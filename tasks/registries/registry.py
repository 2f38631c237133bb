"""A registry: the named entries of one kind (KL estimators, loss aggregations, advantage
estimators), in registration order, and a config field type whose allowed values are its names.

Pure Python: the config (pydantic) and the artifact contracts read it without importing torch.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Iterator, Protocol, TypeVar


class Named(Protocol):
    """What a registry holds: anything with a ``name``."""

    name: str


E = TypeVar("E", bound=Named)


class Registry(Generic[E]):
    """Entries of one kind by name, in registration order.

    Args:
        what: the kind, as a message names it (``"KL estimator"``).
        key: the config key whose values are the names (``"train.kl.estimator"``).

    Iterating, ``len`` and ``in`` see the names at that moment: an entry registered later (by a
    test, by a module of one's own) is seen by every reader that asks after it was added.
    """

    def __init__(self, what: str, key: str):
        self.what, self.key = what, key
        self._entries: dict[str, E] = {}

    def register(self, entry: E) -> E:
        """Add ``entry`` under ``entry.name`` and return it.

        Raises:
            ValueError: the name is empty, holds a ``/`` (the separator of ``kl-check``'s
                configuration names) or is taken.
        """
        name = entry.name
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{self.what} name {name!r} must be a non-empty string without '/'")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> E:
        """Remove the entry ``name`` and return it. Raises ValueError if there is none."""
        self.get(name)
        return self._entries.pop(name)

    @contextmanager
    def added(self, entry: E) -> Iterator[E]:
        """``entry`` registered for the ``with`` block only (a test's own entry)."""
        self.register(entry)
        try:
            yield entry
        finally:
            self._entries.pop(entry.name, None)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def entries(self) -> tuple[E, ...]:
        """The registered entries, in registration order."""
        return tuple(self._entries.values())

    def get(self, name: str) -> E:
        """The entry ``name``. Raises ValueError naming the value and the registered names."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.what} {name!r} is not one of {self.names()}") from None

    def check(self, name: Any) -> str:
        """``name`` if it is registered (a config validator). Raises ValueError naming the key,
        the value and the registered names."""
        if not isinstance(name, str) or name not in self._entries:
            raise ValueError(f"{self.key}={name!r} is not one of {self.names()}")
        return name

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._entries)})"


@dataclass(frozen=True)
class OneOf:
    """Pydantic metadata for a ``str`` field whose value must be a name of ``registry`` when the
    config is validated: ``Annotated[str, OneOf(KL_ESTIMATORS)]``. The docs generator shows the
    names (``scripts/gen_docs.py``)."""

    registry: Registry[Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(self.registry.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        out = handler(schema)
        out["enum"] = list(self.registry.names())  # the names registered when the schema is made
        return out
