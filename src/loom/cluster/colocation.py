"""Rollout time on the training pool's GPUs (H800) relative to the rollout pool's (H20), from
the roofline latency model: what a co-located baseline (veRL) pays for decoding on H800s.

A rollout is modelled as a throughput-bound head, where a replica decodes the largest batch its
KV cache holds at the mean context of a maximum-length response, and a latency-bound straggler
tail of a few sequences near the maximum length. The head and tail take the noise model's time
shares (`tail_start_frac`). H800 has 6.7x the FLOPS of H20 but less HBM (80 vs 96 GB) and less
bandwidth (3.35 vs 4.0 TB/s): heads of small-KV models that are compute-bound on H20 run faster
on H800, heads limited by KV capacity and every latency-bound tail run slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from loom.core.topology import GpuType
from loom.perf.latency import RooflineLatencyModel

__all__ = ["RolloutSpeed", "rollout_speed"]

TAIL_SEQS = 4  # stragglers per replica once the tail is consolidated


@dataclass(frozen=True, kw_only=True)
class RolloutSpeed:
    """Seconds on `other` per second on `base`, for the head and the tail of a rollout."""

    head_ratio: float
    tail_ratio: float

    def time_ratio(self, tail_share: float) -> float:
        """Whole-rollout time ratio when the tail takes `tail_share` of the base time."""
        return (1 - tail_share) * self.head_ratio + tail_share * self.tail_ratio


def _head_s_per_token(gpu: GpuType, model: str, tp: int, context: int) -> float:
    lat = RooflineLatencyModel(gpu, model, tp)
    batch = max(1, lat.kv_capacity_tokens // context)
    return lat.decode_step_time(batch, batch * context) / batch


def _tail_step_s(gpu: GpuType, model: str, tp: int, context: int) -> float:
    return RooflineLatencyModel(gpu, model, tp).decode_step_time(TAIL_SEQS, TAIL_SEQS * context)


@cache
def rollout_speed(
    model: str, tp: int, max_len: int, base: GpuType = GpuType.H20, other: GpuType = GpuType.H800
) -> RolloutSpeed:
    """Decode-time ratio of `other` over `base` for responses up to `max_len` tokens on `tp`-GPU
    replicas (the same GPU count on both: a co-located job reuses its training GPUs)."""
    mean_ctx = max(1, max_len // 2)
    return RolloutSpeed(
        head_ratio=_head_s_per_token(other, model, tp, mean_ctx)
        / _head_s_per_token(base, model, tp, mean_ctx),
        tail_ratio=_tail_step_s(other, model, tp, max_len) / _tail_step_s(base, model, tp, max_len),
    )
