"""The discrete-event `Engine` driven by the wall clock: emulated time is the loop's time since
start divided by the time scale.

Events keep their exact emulated times: whenever the wall clock passes the next event, the
engine runs every event due (in its (time, priority, seq) order, each at its own time), and
anything from outside (a request, an abort) is applied at the wall clock's instant after the
events due before it. So a component driven this way makes the decisions it makes in the
simulator, given the same inputs at the same instants; the loop's lateness delays what the
outside sees, never what the component computes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from loom.sim.engine import Engine

__all__ = ["WallClock"]


class WallClock:
    def __init__(self, engine: Engine, time_scale: float, loop: asyncio.AbstractEventLoop) -> None:
        self.eng = engine
        self.scale = time_scale
        self.loop = loop
        self._t0 = loop.time() - engine.now * time_scale
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None

    def now(self) -> float:
        """Emulated seconds since start, by the wall clock."""
        return (self.loop.time() - self._t0) / self.scale

    def wall(self, t: float) -> float:
        """The loop time of emulated instant `t`."""
        return self._t0 + t * self.scale

    def advance(self) -> None:
        """Run every event due by now; the engine's clock then reads now."""
        self.eng.run(until=max(self.now(), self.eng.now))

    def arm(self) -> None:
        """Wake up at the next pending event."""
        nxt = self.eng.next_time()
        if nxt == self._armed_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_at = nxt
        if nxt is not None:
            self._timer = self.loop.call_at(self.wall(nxt), self._fire)

    @contextmanager
    def step(self) -> Iterator[None]:
        """Around a change from outside: events due first, then the change, then re-arm."""
        self.advance()
        try:
            yield
        finally:
            self.arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self._armed_at = None
        self.advance()
        self.arm()
