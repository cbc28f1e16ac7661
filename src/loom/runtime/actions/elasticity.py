"""Elasticity as clients write it: a table {units: E}, "linear", or "amdahl:P"."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from loom.core.actions import Elasticity
from loom.core.errors import ConfigError

__all__ = ["Amdahl", "ElasticityKind", "Linear", "parse_elasticity"]


class ElasticityKind(StrEnum):
    LINEAR = "linear"  # E(m) = 1: m units are m times faster
    AMDAHL = "amdahl"  # amdahl:P, a fraction P of the work parallelises perfectly


@dataclass(frozen=True)
class Linear:
    def __call__(self, units: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Amdahl:
    """E(m) = 1 / ((1 - p)·m + p): the speedup 1 / ((1 - p) + p/m), divided by m."""

    parallel: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.parallel <= 1.0:
            raise ConfigError(f"amdahl: the parallel part must be in [0, 1], not {self.parallel}")

    def __call__(self, units: int) -> float:
        return 1.0 / ((1.0 - self.parallel) * units + self.parallel)


def _linear(arg: str | None) -> Elasticity:
    if arg:
        raise ConfigError('elasticity "linear" takes no argument')
    return Linear()


def _amdahl(arg: str | None) -> Elasticity:
    try:
        return Amdahl(float(arg or ""))
    except ValueError:
        raise ConfigError(f'"amdahl:P" needs a number P in [0, 1], not {arg!r}') from None


_PARSERS: Mapping[ElasticityKind, Callable[[str | None], Elasticity]] = {
    ElasticityKind.LINEAR: _linear,
    ElasticityKind.AMDAHL: _amdahl,
}


def parse_elasticity(
    spec: Mapping[int, float] | str | None, units: Sequence[int]
) -> Elasticity | None:
    """The E(m) of a request, checked on every unit count in `units`: 0 < E(m) <= 1."""
    if spec is None:
        return None
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        try:
            kind = ElasticityKind(name.strip().lower())
        except ValueError:
            known = ", ".join(f'"{k.value}"' for k in ElasticityKind)
            raise ConfigError(f"unknown elasticity {spec!r} (a table, or one of {known})") from None
        fn = _PARSERS[kind](arg.strip() or None)
    else:
        missing = [u for u in units if u not in spec]
        if missing:
            raise ConfigError(f"the elasticity table has no entry for units {missing}")
        fn = dict(spec)
    for u in units:
        e = fn(u) if callable(fn) else fn[u]
        if not (math.isfinite(e) and 0.0 < e <= 1.0):
            raise ConfigError(f"elasticity E({u}) must be in (0, 1], got {e}")
    return fn
