"""Heddle's per-token time T and interference curve F[k], derived from a LatencyModel."""

from __future__ import annotations

import math

import numpy as np

from loom.core.errors import ConfigError
from loom.perf.latency import LatencyModel

__all__ = ["interference_curve", "token_time"]


def token_time(lat: LatencyModel, context_per_seq: int) -> float:
    """T: seconds per token of one trajectory decoding alone with `context_per_seq` cached."""
    return lat.decode_step_time(1, context_per_seq)


def interference_curve(
    lat: LatencyModel,
    max_size: int,
    context_per_seq: int,
    max_batch: int | None = None,
    active_fraction: float = 1.0,
) -> np.ndarray:
    """F[k], k = 0..max_size: slowdown of one trajectory's per-token time when k share a worker.

    Of k trajectories, b = max(1, round(k·active_fraction)) are decoding (the rest wait on tool
    calls); at most `max_batch` run per step (default: as many as fit the KV cache) and the rest
    queue, so F[k] = step(b', b'·ctx) / step(1, ctx) · ceil(b / max_batch) with b' = min(b,
    max_batch). F[0] = F[1] = 1 and F is made non-decreasing.
    """
    if max_size < 0:
        raise ConfigError(f"max_size must be >= 0, got {max_size}")
    if context_per_seq < 0:
        raise ConfigError(f"context_per_seq must be >= 0, got {context_per_seq}")
    if not 0.0 < active_fraction <= 1.0:
        raise ConfigError(f"active_fraction must be in (0, 1], got {active_fraction}")
    if max_batch is None:
        max_batch = max(1, lat.kv_capacity_tokens // max(1, context_per_seq))
    elif max_batch < 1:
        raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
    base = lat.decode_step_time(1, context_per_seq)
    curve = np.ones(max_size + 1)
    for k in range(2, max_size + 1):
        b = max(1, round(k * active_fraction))
        running = min(b, max_batch)
        step = lat.decode_step_time(running, running * context_per_seq)
        curve[k] = step / base * math.ceil(b / max_batch)
    return np.maximum.accumulate(curve)
