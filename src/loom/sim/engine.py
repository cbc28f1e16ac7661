"""Deterministic discrete-event engine: a heap of (time, priority, seq) keys with cancellation.

Events at the same time run in ascending `priority`, then in the order they were scheduled
(`seq`), so a run never depends on hash order or on the heap's internal layout.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Protocol

from loom.core.errors import ConfigError

__all__ = ["Clock", "Engine", "EventId"]

EventId = int


class Clock(Protocol):
    """What a simulated component (a rollout worker) needs of time: the current instant and
    callbacks at later ones. `Engine` is one; the emulated GPU engine drives an `Engine` by the
    wall clock (`loom.runtime.emulate.clock`), so the same component runs in both."""

    @property
    def now(self) -> float: ...

    def schedule(
        self, time: float, fn: Callable[..., Any], *args: Any, priority: int = 0
    ) -> EventId: ...

    def after(
        self, delay: float, fn: Callable[..., Any], *args: Any, priority: int = 0
    ) -> EventId: ...

    def cancel(self, event_id: EventId) -> None: ...


class Engine:
    """Runs callbacks in simulated time. Callbacks schedule further events through the engine.

    `schedule` returns an id that `cancel` accepts; cancelled events are dropped lazily when
    they reach the top of the heap, so cancelling is O(1).
    """

    __slots__ = ("_cancelled", "_heap", "_seq", "_stopped", "events_run", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.events_run = 0
        self._stopped = False

    def schedule(
        self, time: float, fn: Callable[..., Any], *args: Any, priority: int = 0
    ) -> EventId:
        """Run `fn(*args)` at simulated `time` (not before `now`)."""
        if not time >= self.now:  # also rejects NaN
            raise ConfigError(f"cannot schedule at t={time} before now={self.now}")
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (time, priority, seq, fn, args))
        return seq

    def after(self, delay: float, fn: Callable[..., Any], *args: Any, priority: int = 0) -> EventId:
        """Run `fn(*args)` `delay` seconds from now."""
        if not delay >= 0 or math.isinf(delay):
            raise ConfigError(f"delay must be a finite number >= 0, got {delay}")
        return self.schedule(self.now + delay, fn, *args, priority=priority)

    def cancel(self, event_id: EventId) -> None:
        """Drop a pending event; cancelling one that already ran or was cancelled is a no-op."""
        if 0 <= event_id < self._seq:
            self._cancelled.add(event_id)

    def stop(self) -> None:
        """End the current `run` after the event in progress; pending events stay queued."""
        self._stopped = True

    def next_time(self) -> float | None:
        """Time of the next pending event (cancelled ones dropped), or None when none is."""
        heap, cancelled = self._heap, self._cancelled
        while heap and cancelled and heap[0][2] in cancelled:
            cancelled.discard(heapq.heappop(heap)[2])
        return heap[0][0] if heap else None

    @property
    def pending(self) -> int:
        """Events still queued (cancelled ones not yet dropped included)."""
        return len(self._heap)

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Process events in order until the heap empties, the next event is after `until`, or
        `max_events` have run. Returns the number of events run by this call."""
        heap, cancelled, pop = self._heap, self._cancelled, heapq.heappop
        limit = math.inf if until is None else until
        budget = -1 if max_events is None else max_events
        ran = 0
        self._stopped = False
        while heap and ran != budget and not self._stopped:
            if heap[0][0] > limit:
                break
            time, _prio, seq, fn, args = pop(heap)
            if cancelled and seq in cancelled:
                cancelled.discard(seq)
                continue
            self.now = time
            fn(*args)
            ran += 1
        if until is not None and (not heap or heap[0][0] > until) and until > self.now:
            self.now = until
        self.events_run += ran
        return ran
