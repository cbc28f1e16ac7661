"""When moving a turn to another worker pays, by one rule for the served router and the
simulator of it: a move that cannot carry the trajectory's KV cache with it prefills the
context again at the destination, so it is made only where the time it saves exceeds what
that prefill costs beyond prefilling it where it is (the issue 28 rule that gates Heddle's
migrations and late binding). The time saved is the slot wait, and for a migration also the
pace: the trajectory's remaining tokens (as predicted) decode at the destination's step time
instead of the source's, each with the trajectory among its running turns. Both sides supply
the same figures from what they know: the workers' latency models, their running and
waiting turns and contexts, the time a turn runs, the trajectory's prediction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loom.perf.latency import LatencyModel

__all__ = ["Pace", "decode_step_s", "move_pays", "pace_gain_s", "prefill_s", "slot_wait_s"]


@dataclass
class Pace:
    """An engine's measured pace, moving averages over its finished attempts (None until one
    finished): seconds per decoded token, seconds from an attempt's start to its first token
    (what starting one costs beyond its prefill: the round trip, the engine's admission), and
    a turn's time running."""

    token_s: float | None = None
    start_s: float | None = None
    turn_s: float | None = None
    weight: float = 0.1  # of the newest observation

    def observe(
        self, *, start_s: float | None, decode_s: float, tokens: int, turn_s: float
    ) -> None:
        if start_s is not None:
            self.start_s = self._mix(self.start_s, start_s)
        if tokens > 1:
            self.token_s = self._mix(self.token_s, decode_s / (tokens - 1))
        self.turn_s = self._mix(self.turn_s, turn_s)

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)


def slot_wait_s(running: int, turn_s: float | None, ahead: int = 0) -> float:
    """Seconds until a turn with `ahead` turns before it gets a slot at an engine running
    `running` turns that each take `turn_s` (measured): its running turns end at a rate of
    `running / turn_s`, so `ahead + 1` of them take `(ahead + 1) * turn_s / running`.
    Infinite while nothing has been measured (nothing is known to end)."""
    if turn_s is None:
        return math.inf
    return (ahead + 1) * turn_s / max(1, running)


def prefill_s(lat: LatencyModel | None, tokens: int, cached: int) -> float:
    """Seconds prefilling `tokens` of a sequence, `cached` of them in the prefix cache, adds
    to one step of a worker with latency model `lat` (0 where it has none). NOTE: the step's
    own cost is paid anyway (continuous batching): only the prefill's is counted."""
    cached = min(cached, tokens)
    new = tokens - cached
    if lat is None or new <= 0:
        return 0.0
    return max(0.0, lat.iteration_time(1, 0, new, cached) - lat.iteration_time(1, 0))


def decode_step_s(lat: LatencyModel | None, batch: int, context: int) -> float | None:
    """Seconds one decode step of `batch` running sequences holding `context` tokens takes
    on a worker with latency model `lat` (None where it has none; 0 for no sequence)."""
    if lat is None:
        return None
    return lat.iteration_time(batch, context) if batch > 0 else 0.0


def pace_gain_s(remaining: float, step_here_s: float | None, step_there_s: float | None) -> float:
    """Seconds `remaining` tokens (as predicted) save decoding at a step of `step_there_s`
    rather than `step_here_s`; nothing where either step is unknown (a worker without a
    latency model) or the remainder is not a finite positive number."""
    if step_here_s is None or step_there_s is None:
        return 0.0
    if not (math.isfinite(remaining) and remaining > 0):
        return 0.0
    return remaining * (step_here_s - step_there_s)


def move_pays(
    extra_prefill_s: float, wait_here_s: float, wait_there_s: float, pace_gain_s: float = 0.0
) -> bool:
    """A move whose prefill there costs `extra_prefill_s` beyond staying pays where it costs
    nothing or the slot wait it saves, with what its pace gains (`pace_gain_s`, negative
    where it loses), is larger."""
    return extra_prefill_s <= 0 or (wait_here_s - wait_there_s) + pace_gain_s > extra_prefill_s
