"""A rollout's decode throughput over time as its batch drains (PlexRL §2.2, Fig. 2, Fig. 7c).

Every response of a step starts at once; responses are dealt round-robin to `replicas` engines,
each of which decodes up to `max_running` at a time (continuous batching: a finished response's
slot goes to the next queued one). Between two finishes an engine's batch and step time are
fixed, so the run advances finish by finish (events grow with responses, not tokens). The
long tail shows as throughput falling while the last long responses decode alone: with more
replicas (a colocated rollout spread over the training GPUs) each engine starts with a smaller
batch and drains sooner, so a larger share of the run is spent below peak.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loom.core.errors import ConfigError
from loom.perf.latency import LatencyModel

__all__ = ["DecodeCurve", "decode_curve"]


@dataclass(frozen=True)
class DecodeCurve:
    """Tokens/s of all replicas together, piecewise constant: `rate[i]` over
    [`times[i]`, `times[i + 1]`)."""

    times: np.ndarray
    rate: np.ndarray
    tokens: int
    gpus: int
    saturated_tok_s: float  # every replica at its full batch (`max_running`), mid-length context

    @property
    def makespan_s(self) -> float:
        return float(self.times[-1])

    @property
    def peak_tok_s(self) -> float:
        return float(self.rate.max()) if len(self.rate) else 0.0

    @property
    def auc_ratio(self) -> float:
        """Real-throughput AUC over peak-throughput AUC (Fig. 7c): tokens made over what the
        replicas would have made at their saturated rate in the same time. (§6.2 names the
        ratio, not its peak; the saturated rate is what "unsaturated computation" is measured
        against.)"""
        if self.makespan_s <= 0 or self.saturated_tok_s <= 0:
            return 0.0
        return self.tokens / (self.saturated_tok_s * self.makespan_s)

    @property
    def observed_auc_ratio(self) -> float:
        """The same against the highest rate the run itself reached."""
        if self.makespan_s <= 0 or self.peak_tok_s <= 0:
            return 0.0
        return self.tokens / (self.peak_tok_s * self.makespan_s)

    @property
    def per_gpu_tok_s(self) -> float:
        return self.tokens / self.makespan_s / self.gpus if self.makespan_s > 0 else 0.0


def _replica(lengths: Sequence[int], prompt: int, latency: LatencyModel, cap: int):  # type: ignore[no-untyped-def]
    """(time, rate) change points of one engine."""
    queue = list(lengths)
    running: list[tuple[int, int]] = []  # (tokens made when it finishes, index) heap
    made = 0  # tokens each running response has made since t=0, per step (all step together)
    t = 0.0
    points: list[tuple[float, float]] = []
    ctx_total = 0
    start_made: dict[int, int] = {}
    nxt = 0

    def admit() -> None:
        nonlocal nxt, ctx_total
        while len(running) < cap and nxt < len(queue):
            heapq.heappush(running, (made + queue[nxt], nxt))
            start_made[nxt] = made
            ctx_total += prompt
            nxt += 1

    admit()
    while running:
        b = len(running)
        steps = running[0][0] - made
        # the context grows by b tokens a step: price the interval at its middle
        mid_ctx = ctx_total + b * steps // 2
        dt = latency.decode_step_time(b, max(mid_ctx, 1))
        points.append((t, b / dt))
        t += steps * dt
        made += steps
        ctx_total += b * steps
        while running and running[0][0] <= made:
            _, i = heapq.heappop(running)
            ctx_total -= prompt + queue[i]
        admit()
    points.append((t, 0.0))
    return points


def decode_curve(
    lengths: Sequence[int],
    *,
    replicas: int,
    latency: LatencyModel,
    prompt_tokens: int = 512,
    max_running: int = 256,
) -> DecodeCurve:
    if replicas < 1 or max_running < 1 or not lengths:
        raise ConfigError("need >= 1 replica, max_running >= 1 and at least one response")
    if min(lengths) < 1:
        raise ConfigError("response lengths must be >= 1 token")
    dealt: list[list[int]] = [list(lengths[r::replicas]) for r in range(replicas)]
    events: dict[float, float] = {}
    for share in dealt:
        if not share:
            continue
        prev = 0.0
        for t, rate in _replica(share, prompt_tokens, latency, max_running):
            events[t] = events.get(t, 0.0) + rate - prev
            prev = rate
    times = np.array(sorted(events))
    rate = np.cumsum([events[t] for t in times])
    rate[np.abs(rate) < 1e-9] = 0.0
    gpus = replicas * getattr(latency, "num_gpus", 1)
    full = max_running
    ctx = full * (prompt_tokens + int(np.mean(lengths)) // 2)
    saturated = replicas * full / latency.decode_step_time(full, ctx)
    return DecodeCurve(
        times=times,
        rate=rate[:-1],
        tokens=int(sum(lengths)),
        gpus=gpus,
        saturated_tok_s=saturated,
    )
