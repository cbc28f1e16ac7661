"""Resources: kinds, immutable resource vectors, and feasible sets of units for elastic demands."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

from loom.core.errors import ConfigError

__all__ = [
    "DiscreteSet",
    "FeasibleSet",
    "RangeSet",
    "ResourceKind",
    "ResourceVector",
    "api_quota",
]


class ResourceKind(StrEnum):
    """Built-in resource dimensions; named API quotas use keys made by `api_quota(name)`."""

    CPU = "cpu"
    MEMORY_GB = "memory_gb"
    GPU = "gpu"
    GPU_MEMORY_GB = "gpu_memory_gb"
    KV_TOKENS = "kv_tokens"


def api_quota(name: str) -> str:
    """The resource key of a named API quota (one dimension per API)."""
    if not name:
        raise ConfigError("an API quota needs a non-empty name")
    return f"api:{name}"


class ResourceVector(Mapping[str, float]):
    """An immutable, non-negative amount per resource key; missing keys are zero."""

    __slots__ = ("_d",)

    def __init__(self, amounts: Mapping[str, float] | None = None, /, **kw: float) -> None:
        d: dict[str, float] = {}
        for k, v in {**(amounts or {}), **kw}.items():
            key = str(k.value) if isinstance(k, StrEnum) else str(k)
            v = float(v)
            if math.isnan(v) or v < 0:
                raise ConfigError(f"resource {key!r}: amount must be >= 0, got {v}")
            if v:
                d[key] = v
        self._d = d

    def __getitem__(self, key: str) -> float:
        return self._d.get(str(key), 0.0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(frozenset(self._d.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResourceVector):
            return self._d == other._d
        return NotImplemented

    def __repr__(self) -> str:
        return f"ResourceVector({self._d})"

    def __add__(self, other: Mapping[str, float]) -> ResourceVector:
        keys = set(self) | set(other)
        return ResourceVector({k: self[k] + other.get(k, 0.0) for k in keys})

    def __sub__(self, other: Mapping[str, float]) -> ResourceVector:
        """Difference; raises if any dimension would go negative (an over-release)."""
        keys = set(self) | set(other)
        out = {}
        for k in keys:
            v = self[k] - other.get(k, 0.0)
            if v < -1e-9:
                raise ConfigError(f"resource {k!r} would go negative ({self[k]} - {other[k]})")
            out[k] = max(v, 0.0)
        return ResourceVector(out)

    def scale(self, factor: float) -> ResourceVector:
        return ResourceVector({k: v * factor for k, v in self._d.items()})

    def fits_in(self, capacity: Mapping[str, float]) -> bool:
        """True when every dimension is within `capacity` (absent there means zero)."""
        return all(v <= capacity.get(k, 0.0) + 1e-9 for k, v in self._d.items())

    @staticmethod
    def total(vectors: Iterable[Mapping[str, float]]) -> ResourceVector:
        acc: dict[str, float] = {}
        for vec in vectors:
            for k, v in vec.items():
                acc[k] = acc.get(k, 0.0) + v
        return ResourceVector(acc)


@dataclass(frozen=True)
class RangeSet:
    """Every integer count in [lo, hi]."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if self.lo < 0 or self.hi < self.lo:
            raise ConfigError(
                f"range of units must satisfy 0 <= lo <= hi, got [{self.lo}, {self.hi}]"
            )

    def values(self) -> tuple[int, ...]:
        return tuple(range(self.lo, self.hi + 1))

    @property
    def minimum(self) -> int:
        return self.lo


@dataclass(frozen=True)
class DiscreteSet:
    """An explicit set of allowed counts, e.g. {1, 2, 4, 8} for tensor-parallel degrees."""

    allowed: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.allowed:
            raise ConfigError("a discrete feasible set needs at least one value")
        if any(a < 0 for a in self.allowed):
            raise ConfigError(f"feasible counts must be >= 0, got {self.allowed}")
        object.__setattr__(self, "allowed", tuple(sorted(set(self.allowed))))

    def values(self) -> tuple[int, ...]:
        return self.allowed

    @property
    def minimum(self) -> int:
        return self.allowed[0]


FeasibleSet = RangeSet | DiscreteSet
