"""Seeded random streams: one independent numpy Generator per (seed, name)."""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["Streams", "stream"]


def stream(seed: int, name: str) -> np.random.Generator:
    """A Generator that depends only on `seed` and `name` (never on creation order)."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(key,)))


class Streams:
    """Named random streams under one seed; asking twice for a name gives the same stream."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._cache: dict[str, np.random.Generator] = {}

    def __call__(self, name: str) -> np.random.Generator:
        if name not in self._cache:
            self._cache[name] = stream(self.seed, name)
        return self._cache[name]
