"""Registries of policies keyed by enums: one signature per family, no string if/elif chains."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Generic, TypeVar

from loom.core.errors import UnknownPolicyError

__all__ = ["Registry"]

K = TypeVar("K", bound=StrEnum)
V = TypeVar("V")


class Registry(Generic[K, V]):
    """Maps each member of an enum to a factory; `get` accepts the member or its value."""

    def __init__(self, family: str, keys: type[K]) -> None:
        self.family = family
        self._keys = keys
        self._items: dict[K, V] = {}

    def register(self, key: K) -> Callable[[V], V]:
        def deco(item: V) -> V:
            if key in self._items:
                raise ValueError(f"{self.family}: {key.value!r} is already registered")
            self._items[key] = item
            return item

        return deco

    def add(self, key: K, item: V) -> None:
        self.register(key)(item)

    def key(self, name: K | str) -> K:
        try:
            return self._keys(name)
        except ValueError:
            known = ", ".join(k.value for k in self._keys)
            raise UnknownPolicyError(
                f"Unknown {self.family} policy: {name!r} (known: {known})"
            ) from None

    def get(self, name: K | str) -> V:
        key = self.key(name)
        if key not in self._items:
            raise UnknownPolicyError(f"{self.family} policy {key.value!r} has no implementation")
        return self._items[key]

    def names(self) -> list[str]:
        return [k.value for k in self._items]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __contains__(self, name: object) -> bool:
        try:
            return self._keys(name) in self._items  # type: ignore[arg-type]
        except ValueError:
            return False
